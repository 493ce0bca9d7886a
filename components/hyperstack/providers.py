"""Alias of kimi_cluster.deploy.hyperstack_providers.providers for stacks made by 0.1.0 (components/__init__.py)."""

from kimi_cluster.deploy.hyperstack_providers.providers import (
    EnvironmentProvider,
    KeypairProvider,
    SecurityRuleProvider,
    VirtualMachineProvider,
)

__all__ = ["EnvironmentProvider", "KeypairProvider", "SecurityRuleProvider", "VirtualMachineProvider"]
