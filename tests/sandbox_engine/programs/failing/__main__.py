"""Sandbox engine test program: a file that succeeds, a flaky file, optionally a failing node command or a crash."""

import pulumi
import toyprov
from pulumi_command import remote

cfg = pulumi.Config()
toy_dir = cfg.require("toyDir")

ok = toyprov.File("ok", toy_dir, "fine")
flaky = toyprov.FlakyFile("flaky", toy_dir, "maybe", opts=pulumi.ResourceOptions(depends_on=[ok]))
if cfg.get_bool("failCommand"):
    remote.Command(
        "breaks",
        connection=remote.ConnectionArgs(host="h2"),
        create="echo working; echo 'disk full on /data' >&2; exit 3",
        stdin=cfg.require_secret("token"),
    )

pulumi.export("flaky_path", flaky.path)

if cfg.get_bool("crash"):
    raise ValueError("the program was told to crash")
