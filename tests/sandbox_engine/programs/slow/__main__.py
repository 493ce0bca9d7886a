"""Sandbox engine test program: two files, then a slow remote command, then a file that waits for it."""

import pulumi
import toyprov
from pulumi_command import remote

cfg = pulumi.Config()
toy_dir = cfg.require("toyDir")

first = toyprov.File("r1", toy_dir, "a")
second = toyprov.File("r2", toy_dir, "b", opts=pulumi.ResourceOptions(depends_on=[first]))
slow = remote.Command(
    "slow",
    connection=remote.ConnectionArgs(host="h1"),
    create=f"touch started; sleep {cfg.get('sleep') or '30'}; touch finished",
    delete="rm -f started finished",
    opts=pulumi.ResourceOptions(depends_on=[second]),
)
third = toyprov.File("r3", toy_dir, slow.stdout.apply(lambda out: f"after slow: {out!r}"))

pulumi.export("third_path", third.path)
