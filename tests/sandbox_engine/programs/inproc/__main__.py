"""Sandbox engine test program: a provider relying on a module global the program sets (works only in-process)."""

import pulumi
import toyprov

toyprov.PROGRAM_TOKEN = "set-by-the-program"

fine = toyprov.File("fine", pulumi.Config().require("toyDir"), "x")
needs_global = toyprov.NeedsProgramGlobal("needs-global", opts=pulumi.ResourceOptions(depends_on=[fine]))

pulumi.export("token_len", needs_global.token_len)
