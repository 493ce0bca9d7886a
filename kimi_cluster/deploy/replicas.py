"""Replicas: whole engine groups in one environment, each sized and launched alike; one replica is the plain stack.

A one-replica stack is replica 0 whose head holds the endpoint itself (its TLS proxy, the API port); with two or
more, a front (kimi_cluster/deploy/front.py) holds it and each replica's head answers the front only. The same code
builds both. Replica 0 keeps every resource and VM name a one-replica stack has (kimi-node0, <env>-node0), so adding
a replica never replaces a running VM; replica r >= 1 is named kimi-r<r>-node<rank>, <env>-r<r>-node<rank>. The
replicas are not a ComponentResource of their own for the same reason: a new parent would change every URN of
replica 0.

Rolling (replicas >= 2): replica k+1's launch waits for replica k's engine-ready step (the step table's
`engine-ready@previous-replica`), which re-runs whenever the launch configuration changes (its text carries
readiness_identity). So a new image, engine flag or modelRevision restarts replica k+1 only once replica k serves
again on the new configuration, and the front always has a ready replica. The price: on the first bring-up the
replicas' launches (weight load and warm-up) also run one after another; their downloads and image pulls still run
side by side.

Here: each replica's VMs and their rules. Their steps are the step table's (kimi_cluster/deploy/chain.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pulumi

from kimi_cluster.blueprint.stack import ReplicaArgs
from kimi_cluster.deploy.hyperstack_providers.resources import SecurityRule, VirtualMachine
from kimi_cluster.deploy.rules import security_rules
from kimi_cluster.deploy.vm import VmPlace, vm_with_host_key


@dataclass
class Replica:
    """One engine group: its VMs, their host keys and each rank's rules."""

    index: int
    vms: list[VirtualMachine]
    host_keys: list[pulumi.Output[str]]
    rules: list[list[SecurityRule]]

    @property
    def head_private_ip(self) -> pulumi.Output[str]:
        return self.vms[0].private_ip


def replica_vms(parent: pulumi.Resource, args: ReplicaArgs, place: VmPlace
                ) -> tuple[list[VirtualMachine], list[pulumi.Output[str]]]:
    """The replica's VMs, each with its own pinned host key."""
    made = [vm_with_host_key(parent, vm.resource_name, place, name=vm.name, flavor_name=vm.flavor_name,
                             image_name=vm.image_name, labels=vm.labels) for vm in args.vms]
    return [vm for vm, _ in made], [key for _, key in made]


def replica_rules(parent: pulumi.Resource, args: ReplicaArgs, *, vms: list[VirtualMachine],
                  host_keys: list[pulumi.Output[str]], front_private_ip: pulumi.Input[str] | None = None,
                  fan_out_ips: Sequence[pulumi.Output[str]] = ()) -> Replica:
    """Each rank's ingress rules, from its replica's peers, the front's address and (behind a front) every other
    replica's nodes: `fan_out_ips` lists every GPU node of every replica, replica after replica (the weight download
    is shared across all of them, step_scripts.fan_out_size)."""
    size = len(vms)
    peer_ips = [vm.private_ip for vm in vms]
    others = [ip for i, ip in enumerate(fan_out_ips) if i // size != args.index]
    rules = [security_rules(parent, f"{args.prefix}-node{rank}", vms[rank],
                            args.rules[rank].at(list(peer_ips), front_private_ip, others))
             for rank in range(size)]
    return Replica(args.index, vms, host_keys, rules)
