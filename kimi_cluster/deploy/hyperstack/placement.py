"""Alias of kimi_cluster.deploy.hyperstack_providers.placement for stacks made by 0.2.0 to 0.3.1
(kimi_cluster/deploy/hyperstack/__init__.py says why)."""

from kimi_cluster.deploy.hyperstack_providers.placement import PlacementProvider

__all__ = ["PlacementProvider"]
