"""Hyperstack as Pulumi resources: a requests client (api), dynamic providers (providers), typed resources.

Import resources from here; the API emulator used by tests and the sandbox lives in fakes/hyperstack/.
"""

from .api import ApiSettings, HyperstackClient, HyperstackError
from .failures import ProvisioningError
from .resources import Environment, Keypair, SecurityRule, VirtualMachine

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
