"""What an environment and a VM are asked to be: their inputs as typed specs, with the only timing defaults (which
resources.py refers to), and what of a VM's inputs its outputs echo (user_data only as a digest)."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pulumi.runtime.rpc import UNKNOWN

from kimi_cluster.deploy.hyperstack_providers.inputs import timing_inputs
from kimi_cluster.deploy.unknowns import is_unknown


@dataclass(frozen=True)
class EnvironmentSpec:
    """An environment's inputs. The timing defaults here are the only ones: resources.py refers to them."""

    name: str
    region: str
    delete_timeout_seconds: float = 300.0
    poll_interval_seconds: float = 5.0

    @classmethod
    def from_props(cls, props: Mapping[str, Any]) -> EnvironmentSpec:
        return cls(name=props["name"], region=props["region"], **timing_inputs(cls, props))


ENV_INPUTS = ("name", "region", "delete_timeout_seconds", "poll_interval_seconds")


VM_REPLACE = ("name", "environment_name", "region", "flavor_name", "image_name", "key_name", "user_data",
              "assign_floating_ip")
VM_UPDATE = ("labels", "create_timeout_seconds", "poll_interval_seconds", "delete_timeout_seconds")
VM_INPUTS = VM_REPLACE + VM_UPDATE


@dataclass(frozen=True)
class VmSpec:
    """A VM's inputs. The timing defaults here are the only ones: resources.py refers to them."""

    name: str
    environment_name: str
    region: str
    flavor_name: str
    image_name: str
    key_name: str
    labels: tuple[str, ...] = ()
    user_data: str | None = None
    assign_floating_ip: bool = True
    create_timeout_seconds: float = 1800.0
    poll_interval_seconds: float = 10.0
    delete_timeout_seconds: float = 900.0

    @classmethod
    def from_props(cls, props: Mapping[str, Any]) -> VmSpec:
        return cls(
            name=props["name"], environment_name=props["environment_name"], region=props["region"],
            flavor_name=props["flavor_name"], image_name=props["image_name"], key_name=props["key_name"],
            labels=tuple(props.get("labels") or ()), user_data=props.get("user_data"),
            assign_floating_ip=bool(props.get("assign_floating_ip", True)),
            **timing_inputs(cls, props),
        )

    def echoed_inputs(self) -> dict[str, Any]:
        """The inputs repeated in the outputs (Pulumi diffs against outputs); user_data only as a digest."""
        return {k: (list(getattr(self, k)) if k == "labels" else getattr(self, k))
                for k in VM_INPUTS if k != "user_data"}


def user_data_digest(props: Mapping[str, Any]) -> str | None:
    """user_data may carry secrets (a host key): outputs keep only its SHA-256, enough to detect a change."""
    value = props.get("user_data")
    if is_unknown(value):
        return UNKNOWN
    if value is not None:
        return hashlib.sha256(str(value).encode()).hexdigest()
    return props.get("user_data_sha256")


def vm_outs(spec: VmSpec, vm: Mapping[str, Any], user_data_sha256: str | None) -> dict[str, Any]:
    return {
        **spec.echoed_inputs(),
        "user_data_sha256": user_data_sha256,
        "vm_id": str(vm["id"]),
        "public_ip": vm.get("floating_ip"),
        "private_ip": vm.get("fixed_ip"),
        "status": vm.get("status"),
        "flavor_name": (vm.get("flavor") or {}).get("name") or spec.flavor_name,
    }

