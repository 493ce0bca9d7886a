"""Alias of kimi_cluster.checks.verification_resource for verification stacks made by 0.1.0, whose state names the
provider `checks_resource.VerificationProvider` (components/__init__.py says why such paths stay)."""

from kimi_cluster.checks.verification_resource import VerificationProvider

__all__ = ["VerificationProvider"]
