"""The stack's blueprint: worked out once from the settings, what every VM, rule and step of the stack gets.

Plain data, no Settings and no closure over them: the VMs, each rank's rules (`NodeRules`, filled in with the
addresses at deploy time), the outputs, the compiled node steps (`CompiledSteps`: every step's frozen inputs,
kimi_cluster/blueprint/inputs.py) and every VM's resolved steps (`VmPlan`, from the one step table,
kimi_cluster/plan/steps/). The scripts' text depends on deploy-time values (addresses, peers, the certificate, VM
ids): InferenceCluster renders them with kimi_cluster/plan/steps/scripts.py `render_vm_scripts` once those are known.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from kimi_cluster.blueprint.caretaker import guard_outputs
from kimi_cluster.blueprint.inputs import compile_steps, firewall_inputs
from kimi_cluster.blueprint.pricing import Quote, catalog_quote
from kimi_cluster.plan import firewall
from kimi_cluster.plan.client_configs import build_client_configs
from kimi_cluster.plan.firewall import NodeRules, RuleSpec
from kimi_cluster.plan.steps.model import CompiledSteps, VmPlan
from kimi_cluster.plan.steps.resolve import replica_prefix, resolve_vms
from kimi_cluster.settings import NAMESPACE, Settings, tls_check


@dataclass(frozen=True)
class VmArgs:
    """One VM: its resource name, its Hyperstack name, flavor, image and labels."""

    resource_name: str
    name: str
    flavor_name: str
    image_name: str
    labels: list[str]


@dataclass(frozen=True)
class ReplicaArgs:
    """One replica (engine group): its VMs and each rank's rules (filled in with the addresses at deploy time)."""

    index: int
    prefix: str
    vms: list[VmArgs]
    rules: list[NodeRules]


@dataclass(frozen=True)
class TlsArgs:
    """The endpoint's certificate: the user's own chain (its last block the CA), else the stack's CA signs one."""

    own_chain: list[str] | None
    ca_name: str
    dns_names: list[str]
    key_setting: str  # the config keys a refusal names
    cert_setting: str


@dataclass(frozen=True)
class OutputArgs:
    """What the stack exports that the settings alone decide, and how the rest is worked out."""

    fixed: dict[str, Any]
    front_fixed: dict[str, Any]
    api_hostname: str | None
    api_port: int
    client_configs: Callable[..., dict[str, Any]]  # (endpoint_url, ca_certificate=...)


@dataclass(frozen=True)
class Blueprint:
    """Everything the cluster component makes, as plain values: no Pulumi resource is made here."""

    placement: dict[str, Any]
    env_name: str
    keypair_name: str | None
    ssh_public_key: str | None
    api_key_version: int
    tls: TlsArgs
    replicas: list[ReplicaArgs]
    fan_out: int
    front_vm: VmArgs | None
    front_rules: list[RuleSpec]
    outputs: OutputArgs
    ssh_user: str
    steps: CompiledSteps  # the node steps compiled: the stack's shape, its timing, each step's inputs
    vm_plans: tuple[VmPlan, ...]  # every VM's steps: each node of each replica, then the front


def blueprint(settings: Settings, name: str, quote: Quote | None = None) -> Blueprint:
    """The whole stack's blueprint; `name` prefixes every resource name.

    Read top to bottom, the settings pass each module once: the cost (pricing), the client configs, the
    certificate, the rules (firewall), then the node steps compiled (inputs.py) and resolved per VM (steps.resolve),
    with each step's clock.
    """
    quote = quote or catalog_quote(settings)
    fixed = {
        "served_model_name": settings.served_name,
        "model": settings.model,
        "model_revision": settings.model_revision,
        "api_key_version": settings.api_key_version,
        "api_allowed_cidrs": settings.api_cidrs,
        "node_names": [settings.replica_node_name(r // settings.nodes, r % settings.nodes)
                       for r in range(settings.nodes * settings.replicas)],
        "topology": settings.topology,
        "engine": settings.engine_name,
        "flavor": settings.flavor_name,
        "gpu_count": settings.all_gpus,
        "hourly_cost_usd": quote.usd_per_hour,
        # Where that figure comes from (pricebook and when, or the catalog and its date), and the catalog's.
        "hourly_cost_source": quote.summary(),
        "hourly_cost_catalog_usd": quote.catalog_usd_per_hour,
        **guard_outputs(settings),
    }
    configs = partial(build_client_configs, served_model_name=settings.served_name,
                      context_window=settings.client_context_window, engine=settings.engine_name)
    own_chain = tls_check.split_chain(settings.tls_certificate) if settings.tls_certificate is not None else None
    fw = firewall_inputs(settings)
    front_rules = firewall.operator_rules(fw, 0) if settings.has_front else []
    steps = compile_steps(settings)
    labels = ["kimi-cluster", f"stack-{settings.stack}"]

    replicas = []
    for replica in range(settings.replicas):
        prefix = replica_prefix(name, replica)
        replicas.append(ReplicaArgs(
            index=replica, prefix=prefix,
            vms=[VmArgs(f"{prefix}-node{rank}", settings.replica_node_name(replica, rank), settings.flavor_name,
                        settings.vm_image,
                        [*labels, "role-head" if rank == 0 else "role-worker", f"rank-{rank}",
                         *([f"replica-{replica}"] if settings.has_front else [])])
                 for rank in range(settings.nodes)],
            rules=[firewall.gpu_node_rules(fw, replica, rank) for rank in range(settings.nodes)]))

    front_vm = None
    placement: dict[str, Any] = {"regions": settings.region_choices, "flavor_name": settings.flavor_name,
                                 "count": settings.nodes * settings.replicas, "environment_name": settings.env_name}
    if settings.has_front:
        placement["front_flavor_name"] = settings.front_flavor
        front_vm = VmArgs(f"{name}-front", settings.front_name, settings.front_flavor, settings.front_vm_image,
                          [*labels, "role-front"])
    return Blueprint(
        placement=placement, env_name=settings.env_name, keypair_name=settings.keypair_name,
        ssh_public_key=settings.ssh_public_key, api_key_version=settings.api_key_version,
        tls=TlsArgs(own_chain, f"kimi-cluster {settings.stack} CA",
                    [settings.api_hostname] if settings.api_hostname else [],
                    f"{NAMESPACE}:tlsPrivateKey", f"{NAMESPACE}:tlsCertificate"),
        replicas=replicas, fan_out=steps.shape.fan_out, front_vm=front_vm, front_rules=front_rules,
        outputs=OutputArgs(fixed, {
            "replicas": settings.replicas,
            "front_flavor": settings.front_flavor,
            "replica_node_names": [[settings.replica_node_name(r, n) for n in range(settings.nodes)]
                                   for r in range(settings.replicas)],
        } if settings.has_front else {}, settings.api_hostname, settings.api_port, configs),
        ssh_user=settings.ssh_user, steps=steps, vm_plans=resolve_vms(steps.shape, steps.timing, name))
