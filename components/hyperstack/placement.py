"""Alias of kimi_cluster.deploy.hyperstack_providers.placement for stacks made by 0.1.0 (components/__init__.py)."""

from kimi_cluster.deploy.hyperstack_providers.placement import PlacementProvider

__all__ = ["PlacementProvider"]
