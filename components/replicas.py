"""Replicas: whole engine groups in one environment, each sized and launched alike; one replica is the plain stack.

A one-replica stack is replica 0 whose head holds the endpoint itself (its TLS proxy, the API port); with two or
more, a front (components/front.py) holds it and each replica's head answers the front only. The same code builds
both. Replica 0 keeps every resource and VM name a one-replica stack has (kimi-node0, <env>-node0), so adding a
replica never replaces a running VM; replica r >= 1 is named kimi-r<r>-node<rank>, <env>-r<r>-node<rank>. The
replicas are not a ComponentResource of their own for the same reason: a new parent would change every URN of
replica 0.

Rolling (replicas >= 2): replica k+1's launch waits for replica k's engine-ready step, which re-runs whenever the
launch configuration changes (its text carries readiness_identity). So a new image, engine flag or modelRevision
restarts replica k+1 only once replica k serves again on the new configuration, and the front always has a ready
replica. The price: on the first bring-up the replicas' launches (weight load and warm-up) also run one after
another; their downloads and image pulls still run side by side.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import cast

import pulumi
from pulumi_command import remote

from components import firewall
from components.blueprint import ReplicaArgs
from components.hyperstack.resources import SecurityRule, VirtualMachine
from components.node import VmPlace, vm_with_host_key
from components.node_chain import EndpointKeys, GpuNode, KernelCacheSave, NodeSecrets, Readiness
from components.remote_step import node_connection, remote_command_text, remote_step
from components.step_scripts import NodeSpot


@dataclass
class Replica:
    """One engine group: its VMs, their bring-up chains, and (behind a front) the head's engine-ready step."""

    index: int
    vms: list[VirtualMachine]
    nodes: list[GpuNode]
    public_ips: list[pulumi.Output[str]]
    host_keys: list[pulumi.Output[str]]
    ready: remote.Command | None
    rules: list[SecurityRule] = field(default_factory=list)
    endpoint_ready: Readiness | None = None

    @property
    def head_private_ip(self) -> pulumi.Output[str]:
        return self.vms[0].private_ip


def replica_vms(parent: pulumi.Resource, args: ReplicaArgs, place: VmPlace
                ) -> tuple[list[VirtualMachine], list[pulumi.Output[str]]]:
    """The replica's VMs, each with its own pinned host key."""
    made = [vm_with_host_key(parent, vm.resource_name, place, name=vm.name, flavor_name=vm.flavor_name,
                             image_name=vm.image_name, labels=vm.labels) for vm in args.vms]
    return [vm for vm, _ in made], [key for _, key in made]


def build_replica(parent: pulumi.Resource, args: ReplicaArgs, *, vms: list[VirtualMachine],
                  host_keys: list[pulumi.Output[str]], secrets: NodeSecrets, endpoint: EndpointKeys | None = None,
                  front_private_ip: pulumi.Input[str] | None = None, peer_token: pulumi.Output[str] | None = None,
                  after: Sequence[pulumi.Resource] = (), fan_out_ips: Sequence[pulumi.Output[str]] = ()) -> Replica:
    """Rules, the per-node chains and (behind a front) the engine-ready wait of one replica; its launch starts after
    `after`. `endpoint`: the keys of the endpoint, when this replica's head holds it (one replica, no front).

    `fan_out_ips`: every GPU node of every replica, replica after replica: the weight download is shared across
    all of them (step_scripts.fan_out_size), so each file comes from the hub once for the whole stack and a
    re-created replica fetches from its twin.
    """
    size = len(vms)
    peer_ips = [vm.private_ip for vm in vms]
    others = [ip for i, ip in enumerate(fan_out_ips) if i // size != args.index]
    rules_by_rank = [firewall.security_rules(parent, f"{args.prefix}-node{rank}", vms[rank],
                                             args.rules(rank, list(peer_ips), front_private_ip, others))
                     for rank in range(size)]
    public_ips = [cast(pulumi.Output[str], vm.public_ip) for vm in vms]
    head_private_ip = vms[0].private_ip
    nodes: list[GpuNode] = []
    for rank, vm in enumerate(vms):
        nodes.append(GpuNode(
            f"{args.prefix}-node{rank}", args=args.chains[rank], public_ip=public_ips[rank], private_ip=vm.private_ip,
            head_private_ip=head_private_ip, secrets=secrets, peer_private_ips=list(fan_out_ips),
            peer_token=peer_token, host_key=host_keys[rank],
            # A replaced VM re-runs its whole chain even if it comes back on the same address.
            vm_id=vm.vm_id,
            # Only the node holding the endpoint gets the key and the TLS key; the engines run without one.
            endpoint=endpoint if rank == 0 else None,
            # The guide starts rank 0 first; the others join its rendezvous on port 20000.
            launch_after=[nodes[0].launched] if rank > 0 else list(after),
            # SSH must be allowed in before the first command dials.
            opts=pulumi.ResourceOptions(parent=parent, depends_on=rules_by_rank[rank])))
    ready = None
    wait = args.engine_ready
    if wait is not None:
        text = pulumi.Output.all(head_private_ip, vms[0].vm_id).apply(lambda a: remote_command_text(
            wait.step, wait.render(NodeSpot(private_ip=a[0], head_private_ip=a[0])), deadline_s=wait.clock.deadline_s,
            vm_id=a[1]))
        ready = remote_step(parent, f"{args.prefix}-engine-ready", text,
                            node_connection(public_ips[0], wait.ssh_user, secrets.ssh_private_key, host_keys[0]),
                            [n.launched for n in nodes], None, wait.clock.timeout)
    endpoint_ready = None
    if args.endpoint_wait is not None and endpoint is not None:
        # The head answers only once every rank has joined the rendezvous, so wait on all launches and the proxy.
        head_proxy = [nodes[0].proxy] if nodes[0].proxy is not None else []
        endpoint_ready = Readiness(
            f"{args.prefix}-ready", args=args.endpoint_wait, public_ip=public_ips[0],
            ssh_private_key=secrets.ssh_private_key, endpoint=endpoint, host_key=host_keys[0],
            opts=pulumi.ResourceOptions(parent=parent, depends_on=[*(n.launched for n in nodes), *head_proxy]))
    saved_after = ready if ready is not None else endpoint_ready.command if endpoint_ready is not None else None
    credentials = secrets.kernel_cache_credentials
    if args.cache_save is not None and credentials is not None and saved_after is not None:
        # Once the head serves. Nothing depends on it, so the endpoint never waits for the save and a failed save
        # fails nothing.
        KernelCacheSave(f"{args.prefix}-kernel-cache", args=args.cache_save, public_ip=public_ips[0],
                        ssh_private_key=secrets.ssh_private_key, credentials=credentials, host_key=host_keys[0],
                        opts=pulumi.ResourceOptions(parent=parent, depends_on=[saved_after]))
    return Replica(args.index, vms, nodes, public_ips, host_keys, ready, [r for rs in rules_by_rank for r in rs],
                   endpoint_ready)
