"""Pulumi program of the verification stack: read the cluster stack's outputs and check its endpoint.
Exports verified_endpoint_url only when every required check passed; otherwise `pulumi up` fails naming them.
The program lives in kimi_cluster/checks/verification_stack.py.
"""

import pulumi

from kimi_cluster.checks import verification_stack

for name, value in verification_stack.build(verification_stack.load_settings(pulumi.Config())).items():
    pulumi.export(name, value)
