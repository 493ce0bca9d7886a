"""Sandbox engine test program: a StackReference to the basic program's stack, re-exporting two of its outputs."""

import pulumi

upstream = pulumi.StackReference("org/toy/dev")
pulumi.export("upstream_hello", upstream.get_output("hello"))
pulumi.export("upstream_key", upstream.require_output("api_key"))
