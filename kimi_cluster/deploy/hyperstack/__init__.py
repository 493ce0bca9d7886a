"""Hyperstack as Pulumi resources: a requests client (api), dynamic providers (providers), typed resources.

Import resources from here; the API emulator used by tests and the sandbox lives in
kimi_cluster.fakes.hyperstack_emulator.
"""

from kimi_cluster.deploy.hyperstack.failures import ProvisioningError
from kimi_cluster.deploy.hyperstack.resources import Environment, Keypair, SecurityRule, VirtualMachine
from kimi_cluster.hyperstack.api import ApiSettings, HyperstackClient, HyperstackError

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
