"""Alias of kimi_cluster.deploy.vm (a VM with its pinned host key) for stacks made by 0.1.0 (components/__init__.py)."""

from kimi_cluster.deploy.vm import _HostKeyProvider

__all__ = ["_HostKeyProvider"]
