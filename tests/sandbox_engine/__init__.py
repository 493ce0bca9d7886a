"""Tests of the sandbox engine (sandbox/): real Pulumi programs driven through the SDK's runtime, no Pulumi CLI."""
