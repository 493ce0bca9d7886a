"""The stack's blueprint: worked out once from the settings, what every VM, node chain and wait of the stack gets.

InferenceCluster reads its settings here and nowhere else. Each component then gets its own small arguments (as
pulumi/examples' SpokeVpcArgs do): a GPU node its `ChainArgs`, a wait on one VM its `WaitArgs`, the front its
`FrontArgs`, a replica its `ReplicaArgs`. Timing travels inside them, as each step's `Clock`, and the scripts as
renderers that take only what is known at deploy time (a node's addresses, the certificate), as a `NodeSpot`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from kimi_cluster.plan import firewall, proxy
from kimi_cluster.plan.caretaker import guard_outputs
from kimi_cluster.plan.client_configs import build_client_configs
from kimi_cluster.plan.firewall import RuleSpec
from kimi_cluster.plan.pricing import Quote, catalog_quote
from kimi_cluster.plan.step_scripts import (
    NodeSpot,
    ProxyTls,
    cache_save_script,
    fan_out_size,
    front_identity,
    render_front_step,
    render_spot_step,
    serves_api,
    spot_scripts,
)
from kimi_cluster.settings import NAMESPACE, Settings, tls_check
from kimi_cluster.settings.steps import ALL_STEPS


@dataclass(frozen=True)
class Clock:
    """A step's deadline on the node, and the custom timeout that bounds its SSH dial (kimi_cluster/settings/
    timing.py)."""

    deadline_s: int
    timeout: str


@dataclass(frozen=True)
class ChainArgs:
    """One GPU node's bring-up chain: its rank, its steps' clocks, and its scripts rendered from where it stands.

    `fan_out` nodes share one weight download (the node shares when it gets that many peer addresses and the peer
    token); `peer_rank` is its place among them. `serves_api`: it runs the endpoint's TLS proxy (one replica's head).
    """

    rank: int
    ssh_user: str
    clocks: Mapping[str, Clock]
    serves_api: bool
    kernel_cache: bool
    warmup: bool
    fan_out: int
    peer_rank: int | None
    render: Callable[[NodeSpot], dict[str, str]]


@dataclass(frozen=True)
class WaitArgs:
    """One step run once on one VM: the readiness wait, a replica's engine-ready wait, the kernel-cache save."""

    step: str
    ssh_user: str
    clock: Clock
    render: Callable[[NodeSpot], str]
    container: str | None = None  # the container whose log a failed wait prints (None: the engine's)


@dataclass(frozen=True)
class VmArgs:
    """One VM: its resource name, its Hyperstack name, flavor, image and labels."""

    resource_name: str
    name: str
    flavor_name: str
    image_name: str
    labels: list[str]


@dataclass(frozen=True)
class FrontArgs:
    """The front (replicas >= 2): its rules, its two steps and the readiness wait through it."""

    ssh_user: str
    rules: list[RuleSpec]
    clocks: Mapping[str, Clock]
    render: Callable[[str, Sequence[str], ProxyTls], str]  # (step, the replicas' head addresses, tls) -> script
    identity: Callable[[Sequence[str]], str]  # the readiness wait's, from the replicas' head addresses
    wait: WaitArgs


@dataclass(frozen=True)
class ReplicaArgs:
    """One replica (engine group): its VMs, each node's chain, its rules and (behind a front) its engine-ready wait.

    `rules(rank, peer_ips, front_private_ip, other_replicas_ips)`: the rank's ingress rules.
    """

    index: int
    prefix: str
    vms: list[VmArgs]
    chains: list[ChainArgs]
    rules: Callable[[int, list[Any], Any, list[Any]], list[RuleSpec]]
    engine_ready: WaitArgs | None  # behind a front: the head's engine answers the front
    endpoint_wait: WaitArgs | None = None  # one replica: its head holds the endpoint, and waits on it
    cache_save: WaitArgs | None = None  # replica 0 with kimi-cluster:kernelCache: its head saves the kernels


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
    """Everything the cluster component makes, as plain values and renderers: no Pulumi resource is made here."""

    placement: dict[str, Any]
    env_name: str
    keypair_name: str | None
    ssh_public_key: str | None
    api_key_version: int
    tls: TlsArgs
    replicas: list[ReplicaArgs]
    fan_out: int
    front_vm: VmArgs | None
    front: FrontArgs | None
    outputs: OutputArgs
    caretaker: WaitArgs | None = None  # idleStopMinutes or budgetUsd: the caretaker step on the endpoint's VM


def blueprint(settings: Settings, name: str, quote: Quote | None = None) -> Blueprint:
    """The whole stack's blueprint; `name` prefixes every resource name.

    Read top to bottom, the settings pass each module once: the clocks (timing), the cost (pricing), the client
    configs, the certificate, the rules (firewall), then the scripts (step_scripts), whose renderers are bound here
    and called by the components once the addresses are known.
    """
    timing = settings.timing  # kimi-cluster:nodeTiming, else Timing()'s defaults
    times = {step: Clock(timing.deadline_s(step, settings), timing.custom_timeout(step, settings))
             for step in ALL_STEPS}
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
    front_rules = firewall.operator_rules(settings, 0) if settings.has_front else []
    fan_out = fan_out_size(settings)
    ssh_user = settings.ssh_user
    labels = ["kimi-cluster", f"stack-{settings.stack}"]

    replicas = []
    for replica in range(settings.replicas):
        prefix = name if replica == 0 else f"{name}-r{replica}"
        replicas.append(ReplicaArgs(
            index=replica, prefix=prefix,
            vms=[VmArgs(f"{prefix}-node{rank}", settings.replica_node_name(replica, rank), settings.flavor_name,
                        settings.vm_image,
                        [*labels, "role-head" if rank == 0 else "role-worker", f"rank-{rank}",
                         *([f"replica-{replica}"] if settings.has_front else [])])
                 for rank in range(settings.nodes)],
            chains=[ChainArgs(rank=rank, ssh_user=ssh_user, clocks=times, serves_api=serves_api(settings, rank),
                              kernel_cache=settings.kernel_cache is not None, warmup=settings.kernel_warmup,
                              fan_out=fan_out,
                              # Behind a front the fan-out spans every replica: a node's place in it is not its rank.
                              peer_rank=replica * settings.nodes + rank if settings.has_front else None,
                              render=partial(spot_scripts, settings, timing=timing))
                    for rank in range(settings.nodes)],
            rules=partial(firewall.gpu_node_rules, settings, replica),
            engine_ready=WaitArgs("engine-ready", ssh_user, times["engine-ready"],
                                  partial(render_spot_step, settings, "engine-ready", timing=timing))
            if settings.has_front else None,
            endpoint_wait=WaitArgs("readiness", ssh_user, times["readiness"],
                                   partial(render_spot_step, settings, "readiness", timing=timing))
            if replica == 0 and not settings.has_front else None,
            # Every replica compiles the same kernels for the same key: replica 0's head saves them.
            cache_save=WaitArgs("cache-save", ssh_user, times["cache-save"],
                                partial(cache_save_script, settings, timing=timing))
            if replica == 0 and settings.kernel_cache is not None else None))

    front_vm = front = None
    placement: dict[str, Any] = {"regions": settings.region_choices, "flavor_name": settings.flavor_name,
                                 "count": settings.nodes * settings.replicas, "environment_name": settings.env_name}
    if settings.has_front:
        placement["front_flavor_name"] = settings.front_flavor
        front_vm = VmArgs(f"{name}-front", settings.front_name, settings.front_flavor, settings.front_vm_image,
                          [*labels, "role-front"])
        front = FrontArgs(ssh_user, front_rules, times, partial(render_front_step, settings, timing=timing),
                          partial(front_identity, settings),
                          WaitArgs("readiness", ssh_user, times["readiness"],
                                   partial(render_spot_step, settings, "readiness", timing=timing),
                                   container=proxy.CONTAINER_NAME))
    return Blueprint(
        placement=placement, env_name=settings.env_name, keypair_name=settings.keypair_name,
        ssh_public_key=settings.ssh_public_key, api_key_version=settings.api_key_version,
        tls=TlsArgs(own_chain, f"kimi-cluster {settings.stack} CA",
                    [settings.api_hostname] if settings.api_hostname else [],
                    f"{NAMESPACE}:tlsPrivateKey", f"{NAMESPACE}:tlsCertificate"),
        replicas=replicas, fan_out=fan_out, front_vm=front_vm, front=front,
        outputs=OutputArgs(fixed, {
            "replicas": settings.replicas,
            "front_flavor": settings.front_flavor,
            "replica_node_names": [[settings.replica_node_name(r, n) for n in range(settings.nodes)]
                                   for r in range(settings.replicas)],
        } if settings.has_front else {}, settings.api_hostname, settings.api_port, configs),
        caretaker=WaitArgs("caretaker", ssh_user, times["caretaker"],
                           partial(render_spot_step, settings, "caretaker", timing=timing))
        if settings.guarded else None)
