"""Alias of kimi_cluster.deploy.tls for stacks made by 0.1.0 (components/__init__.py)."""

from kimi_cluster.deploy.tls import _CaProvider, _ServerCertProvider

__all__ = ["_CaProvider", "_ServerCertProvider"]
