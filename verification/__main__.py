"""Pulumi program of the verification stack: read the cluster stack's outputs and check its endpoint.
Exports verified_endpoint_url only when every required check passed; otherwise `pulumi up` fails naming them.
"""

import os
import sys

# Pulumi runs this directory as a script; make its modules importable by the same top-level names
# the dynamic provider host will use to unpickle the provider.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import pulumi

import verification_stack

for name, value in verification_stack.build(verification_stack.load_settings(pulumi.Config())).items():
    pulumi.export(name, value)
