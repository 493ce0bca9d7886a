"""Hyperstack as Pulumi resources: the dynamic providers (providers, placement) and the typed resources.

Import resources from here; the API client is kimi_cluster.hyperstack_api, and the API emulator used by tests and the
sandbox lives in kimi_cluster.fakes.hyperstack_emulator.
"""

from kimi_cluster.deploy.hyperstack_providers.failures import ProvisioningError
from kimi_cluster.deploy.hyperstack_providers.resources import Environment, Keypair, SecurityRule, VirtualMachine
from kimi_cluster.hyperstack_api.api import ApiSettings, HyperstackClient, HyperstackError

__all__ = [
    "ApiSettings",
    "Environment",
    "HyperstackClient",
    "HyperstackError",
    "Keypair",
    "ProvisioningError",
    "SecurityRule",
    "VirtualMachine",
]
