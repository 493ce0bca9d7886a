"""Alias of kimi_cluster.deploy.generated_secret for stacks made by 0.1.0 (components/__init__.py)."""

from kimi_cluster.deploy.generated_secret import _GeneratedSecretProvider

__all__ = ["_GeneratedSecretProvider"]
