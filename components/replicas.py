"""Replicas (replicas >= 2): whole engine groups in one environment, each sized and launched like today's cluster.

Replica 0 keeps every resource and VM name a one-replica stack has (kimi-node0, <env>-node0), so adding a replica
never replaces a running VM; replica r >= 1 is named kimi-r<r>-node<rank>, <env>-r<r>-node<rank>. The replicas are
not a ComponentResource of their own for the same reason: a new parent would change every URN of replica 0.

Rolling: replica k+1's launch waits for replica k's engine-ready step, which re-runs whenever the launch
configuration changes (its text carries readiness_identity). So a new image, engine flag or modelRevision restarts
replica k+1 only once replica k serves again on the new configuration, and the front always has a ready replica.
The price: on the first bring-up the replicas' launches (weight load and warm-up) also run one after another; their
downloads and image pulls still run side by side.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import cast

import pulumi
from pulumi_command import remote

from components import firewall
from components.hyperstack.resources import SecurityRule, VirtualMachine
from components.node import (
    GpuNode,
    _command,
    host_key_user_data,
    node_connection,
    remote_command_text,
    render_step,
)
from components.settings import Settings
from components.timing import Timing


def prefix(name: str, replica: int) -> str:
    """Resource-name prefix of a replica: replica 0 keeps the one-replica names."""
    return name if replica == 0 else f"{name}-r{replica}"


@dataclass
class Replica:
    """One engine group: its VMs, their bring-up chains, and the head's engine-ready step."""

    index: int
    vms: list[VirtualMachine]
    nodes: list[GpuNode]
    public_ips: list[pulumi.Output[str]]
    host_keys: list[pulumi.Output[str]]
    ready: remote.Command
    rules: list[SecurityRule] = field(default_factory=list)

    @property
    def head_private_ip(self) -> pulumi.Output[str]:
        return self.vms[0].private_ip


def replica_vms(parent: pulumi.Resource, name: str, settings: Settings, replica: int, *,
                environment_name: pulumi.Input[str], region: pulumi.Input[str], key_name: pulumi.Input[str]
                ) -> tuple[list[VirtualMachine], list[pulumi.Output[str]]]:
    """The replica's VMs, labelled with their replica, each with its own pinned host key."""
    child = pulumi.ResourceOptions(parent=parent)
    vms, host_keys = [], []
    for rank in range(settings.nodes):
        res = f"{prefix(name, replica)}-node{rank}"
        user_data, host_key = host_key_user_data(res, opts=child)
        host_keys.append(host_key)
        vms.append(VirtualMachine(
            res, name=settings.replica_node_name(replica, rank), environment_name=environment_name, region=region,
            flavor_name=settings.flavor_name, image_name=settings.vm_image, key_name=key_name,
            labels=["kimi-cluster", f"stack-{settings.stack}", "role-head" if rank == 0 else "role-worker",
                    f"rank-{rank}", f"replica-{replica}"],
            user_data=user_data, assign_floating_ip=True, opts=child))
    return vms, host_keys


def build_replica(parent: pulumi.Resource, name: str, settings: Settings, replica: int, *,
                  vms: list[VirtualMachine], host_keys: list[pulumi.Output[str]],
                  front_private_ip: pulumi.Input[str], ssh_private_key: pulumi.Output[str],
                  hf_token: pulumi.Output[str] | None, kernel_cache_credentials: pulumi.Output[str] | None,
                  peer_token: pulumi.Output[str] | None, after: Sequence[pulumi.Resource] = (),
                  fan_out_ips: Sequence[pulumi.Output[str]] = (), timing: Timing | None = None) -> Replica:
    """Rules, the per-node chains and the engine-ready wait of one replica; its launch starts after `after`.

    `fan_out_ips`: every GPU node of every replica, replica after replica: the weight download is shared across
    all of them (components/node.py fan_out_size), so each file comes from the hub once for the whole stack and a
    re-created replica fetches from its twin.
    """
    timing = settings.timing if timing is None else timing  # kimi-cluster:nodeTiming (tests pass shorter ones)
    base = prefix(name, replica)
    peer_ips = [vm.private_ip for vm in vms]
    others = [ip for i, ip in enumerate(fan_out_ips) if i // settings.nodes != replica]
    rules_by_rank = [
        [SecurityRule(f"{base}-node{rank}-{spec.key}", vm_id=vms[rank].vm_id, direction="ingress",
                      protocol=spec.protocol, ethertype=spec.ethertype, remote_ip_prefix=spec.remote_ip_prefix,
                      port_range_min=spec.port_range_min, port_range_max=spec.port_range_max,
                      opts=pulumi.ResourceOptions(parent=parent))
         for spec in firewall.replica_node_rules(settings, rank, peer_ips, front_private_ip)
         + firewall.fan_out_rules(settings, replica, others)]
        for rank in range(settings.nodes)]
    public_ips = [cast(pulumi.Output[str], vm.public_ip) for vm in vms]
    head_private_ip = vms[0].private_ip
    nodes: list[GpuNode] = []
    for rank, vm in enumerate(vms):
        nodes.append(GpuNode(
            f"{base}-node{rank}", settings=settings, rank=rank, public_ip=public_ips[rank], private_ip=vm.private_ip,
            head_private_ip=head_private_ip, ssh_private_key=ssh_private_key, hf_token=hf_token,
            kernel_cache_credentials=kernel_cache_credentials, peer_private_ips=list(fan_out_ips),
            peer_rank=replica * settings.nodes + rank, peer_token=peer_token, host_key=host_keys[rank],
            vm_id=vm.vm_id,
            # No key and no proxy on any replica: the front holds both.
            launch_after=[nodes[0].launched] if rank > 0 else list(after), timing=timing,
            opts=pulumi.ResourceOptions(parent=parent, depends_on=rules_by_rank[rank])))
    deadline = timing.deadline_s("engine-ready", settings)
    text = pulumi.Output.all(head_private_ip, vms[0].vm_id).apply(lambda a: remote_command_text(
        "engine-ready", render_step(settings, "engine-ready", 0, a[0], a[0], timing), deadline_s=deadline,
        vm_id=a[1]))
    ready = _command(parent, f"{base}-engine-ready", text,
                     node_connection(public_ips[0], settings.ssh_user, ssh_private_key, host_keys[0]),
                     [n.launched for n in nodes], None, timing.custom_timeout("engine-ready", settings))
    return Replica(replica, vms, nodes, public_ips, host_keys, ready, [r for rs in rules_by_rank for r in rs])
