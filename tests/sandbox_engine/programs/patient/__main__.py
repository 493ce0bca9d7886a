"""Sandbox engine test program: a node command and a dynamic resource that each run past their customTimeouts."""

import pulumi
import toyprov
from pulumi_command import remote

cfg = pulumi.Config()
toy_dir = cfg.require("toyDir")
short = pulumi.CustomTimeouts(create="1s", update="1s", delete="1s")

slow = remote.Command("slow", connection=remote.ConnectionArgs(host="h1"), create="sleep 2.5; echo finished",
                      opts=pulumi.ResourceOptions(custom_timeouts=short))
late = toyprov.File("late", toy_dir, "x", delay=2.5, opts=pulumi.ResourceOptions(custom_timeouts=short))
pulumi.export("slow", slow.stdout)
pulumi.export("late", late.path)
