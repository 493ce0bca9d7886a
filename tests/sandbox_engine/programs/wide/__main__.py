"""Sandbox engine test program: six slow dynamic resources that could all run at once."""

import pulumi
import toyprov

cfg = pulumi.Config()
toy_dir = cfg.require("toyDir")

files = [toyprov.File(f"w{i}", toy_dir, str(i), delay=1.5) for i in range(6)]
pulumi.export("paths", [f.path for f in files])
