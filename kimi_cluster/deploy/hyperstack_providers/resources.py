"""Typed Pulumi resources for Hyperstack: Environment, Keypair, VirtualMachine and SecurityRule.

Each is a dynamic resource with its own type token (`pulumi-python:dynamic/hyperstack:<Name>`); no credential is
an input or an output: providers read `hyperstack:apiKey` / HYPERSTACK_API_KEY when they run.

Signatures (every input accepts a plain value or a pulumi.Input; ids are strings; the timing defaults `...` are
those of EnvironmentSpec and VmSpec in specs.py):

    Environment(resource_name, *, name, region, delete_timeout_seconds=..., poll_interval_seconds=..., opts=None)
        -> environment_id, name, region                         (name or region change: replace)

    Keypair(resource_name, *, name, environment_name, public_key, opts=None)
        -> keypair_id, name, fingerprint, environment_name, public_key          (any change: replace)

    VirtualMachine(resource_name, *, name, environment_name, region, flavor_name, image_name, key_name,
                   labels=(), user_data=None, assign_floating_ip=True, create_timeout_seconds=...,
                   poll_interval_seconds=..., delete_timeout_seconds=..., opts=None)
        -> vm_id, public_ip, private_ip, status, flavor_name, name, labels
           (labels and timings update in place; name, environment, region, flavor, image, key, user_data and
            assign_floating_ip replace, deleting the old VM first)

    SecurityRule(resource_name, *, vm_id, remote_ip_prefix, direction="ingress", protocol="tcp",
                 ethertype="IPv4", port_range_min=None, port_range_max=None, opts=None)
        -> rule_id, vm_id                                       (any change: replace, new rule first)

`user_data` may carry secrets: pass it as a secret Output (the engine then encrypts the input in state); the
provider never echoes it, outputs keep only `user_data_sha256`. The public key is not a secret and is kept as is.
"""

from __future__ import annotations

from collections.abc import Sequence

import pulumi
import pulumi.dynamic

from kimi_cluster.deploy.hyperstack_providers.providers import (
    EnvironmentProvider,
    KeypairProvider,
    SecurityRuleProvider,
    VirtualMachineProvider,
)
from kimi_cluster.deploy.hyperstack_providers.specs import EnvironmentSpec, VmSpec


class Environment(pulumi.dynamic.Resource, module="hyperstack", name="Environment"):
    """A Hyperstack environment, bound to one region; names are unique across the organisation."""

    environment_id: pulumi.Output[str]
    name: pulumi.Output[str]
    region: pulumi.Output[str]

    def __init__(
        self,
        resource_name: str,
        *,
        name: pulumi.Input[str],
        region: pulumi.Input[str],
        delete_timeout_seconds: pulumi.Input[float] = EnvironmentSpec.delete_timeout_seconds,
        poll_interval_seconds: pulumi.Input[float] = EnvironmentSpec.poll_interval_seconds,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        props = {
            "name": name,
            "region": region,
            "delete_timeout_seconds": delete_timeout_seconds,
            "poll_interval_seconds": poll_interval_seconds,
            "environment_id": None,
        }
        super().__init__(EnvironmentProvider(), resource_name, props, opts)


class Keypair(pulumi.dynamic.Resource, module="hyperstack", name="Keypair"):
    """An imported OpenSSH public key, scoped to one environment."""

    keypair_id: pulumi.Output[str]
    name: pulumi.Output[str]
    fingerprint: pulumi.Output[str]
    environment_name: pulumi.Output[str]
    public_key: pulumi.Output[str]

    def __init__(
        self,
        resource_name: str,
        *,
        name: pulumi.Input[str],
        environment_name: pulumi.Input[str],
        public_key: pulumi.Input[str],
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        props = {
            "name": name,
            "environment_name": environment_name,
            "public_key": public_key,
            "keypair_id": None,
            "fingerprint": None,
        }
        super().__init__(KeypairProvider(), resource_name, props, opts)


class VirtualMachine(pulumi.dynamic.Resource, module="hyperstack", name="VirtualMachine"):
    """One VM; create returns only once it is ACTIVE (with its floating IP), or deletes it and fails."""

    vm_id: pulumi.Output[str]
    public_ip: pulumi.Output[str | None]
    private_ip: pulumi.Output[str]
    status: pulumi.Output[str]
    flavor_name: pulumi.Output[str]
    name: pulumi.Output[str]
    labels: pulumi.Output[list]

    def __init__(
        self,
        resource_name: str,
        *,
        name: pulumi.Input[str],
        environment_name: pulumi.Input[str],
        region: pulumi.Input[str],
        flavor_name: pulumi.Input[str],
        image_name: pulumi.Input[str],
        key_name: pulumi.Input[str],
        labels: pulumi.Input[Sequence[pulumi.Input[str]]] = (),
        user_data: pulumi.Input[str] | None = None,
        assign_floating_ip: pulumi.Input[bool] = True,
        create_timeout_seconds: pulumi.Input[float] = VmSpec.create_timeout_seconds,
        poll_interval_seconds: pulumi.Input[float] = VmSpec.poll_interval_seconds,
        delete_timeout_seconds: pulumi.Input[float] = VmSpec.delete_timeout_seconds,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        props = {
            "name": name,
            "environment_name": environment_name,
            "region": region,
            "flavor_name": flavor_name,
            "image_name": image_name,
            "key_name": key_name,
            "labels": list(labels) if isinstance(labels, (list, tuple)) else labels,
            "user_data": user_data,
            "assign_floating_ip": assign_floating_ip,
            "create_timeout_seconds": create_timeout_seconds,
            "poll_interval_seconds": poll_interval_seconds,
            "delete_timeout_seconds": delete_timeout_seconds,
            "vm_id": None,
            "public_ip": None,
            "private_ip": None,
            "status": None,
        }
        super().__init__(VirtualMachineProvider(), resource_name, props, opts)


class SecurityRule(pulumi.dynamic.Resource, module="hyperstack", name="SecurityRule"):
    """One firewall rule on one VM (`/core/virtual-machines/{vm_id}/sg-rules`)."""

    rule_id: pulumi.Output[str]
    vm_id: pulumi.Output[str]

    def __init__(
        self,
        resource_name: str,
        *,
        vm_id: pulumi.Input[str],
        remote_ip_prefix: pulumi.Input[str],
        direction: pulumi.Input[str] = "ingress",
        protocol: pulumi.Input[str] = "tcp",
        ethertype: pulumi.Input[str] = "IPv4",
        port_range_min: pulumi.Input[int] | None = None,
        port_range_max: pulumi.Input[int] | None = None,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        props = {
            "vm_id": vm_id,
            "direction": direction,
            "protocol": protocol,
            "ethertype": ethertype,
            "remote_ip_prefix": remote_ip_prefix,
            "port_range_min": port_range_min,
            "port_range_max": port_range_max,
            "rule_id": None,
        }
        super().__init__(SecurityRuleProvider(), resource_name, props, opts)
