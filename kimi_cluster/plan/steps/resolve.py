"""The step table resolved against the stack's shape, once: one `VmPlan` per VM, every node of every replica and the
front, each with its ordered steps, their resource names, parents, clocks, dependencies and stdin keys.

Plain data only: it reads the compiled StackShape and Timing, never the settings. Naming follows what a live stack
already holds (its URNs): replica 0 is named as a one-replica stack (kimi-node0, kimi-ready), replica r >= 1
kimi-r<r>-node<rank>, the front kimi-front.
"""

from __future__ import annotations

from kimi_cluster.plan.steps.clocks import clock
from kimi_cluster.plan.steps.model import (
    ENDPOINT,
    FRONT,
    FRONT_TYPE,
    GPU_NODE_TYPE,
    HEAD,
    NODE,
    Place,
    StackShape,
    Step,
    StepPlan,
    VmPlan,
)
from kimi_cluster.plan.steps.table import TABLE
from kimi_cluster.settings.timing import Timing


def replica_prefix(name: str, replica: int) -> str:
    """The resource-name prefix of one replica's VMs and steps.

    Replica 0 keeps the bare name, so a one-replica stack keeps the URNs it had before replicas existed.
    """
    return name if replica == 0 else f"{name}-r{replica}"


def _runs_here(step: Step, shape: StackShape, place: Place) -> bool:
    if place.front:
        where = step.where == FRONT or step.where == ENDPOINT and shape.has_front
    else:
        where = (step.where == NODE or step.where == HEAD and place.rank == 0
                 or step.where == ENDPOINT and not shape.has_front and place.rank == 0 and place.replica == 0)
    return where and step.when(shape, place)


class _Vm:
    """A VM while its plan is worked out: where it stands, and its steps' resource names by step."""

    def __init__(self, shape: StackShape, name: str, place: Place) -> None:
        self.place = place
        if place.front:
            self.resource, self.group, self.hs_name = f"{name}-front", f"{name}-front", shape.front_name
        else:
            self.group = replica_prefix(name, place.replica)
            self.resource = f"{self.group}-node{place.rank}"
            self.hs_name = shape.node_names[place.replica][place.rank]
        self.steps = [s for s in TABLE if _runs_here(s, shape, place)]
        fmt = {"vm": self.resource, "group": self.group, "stack": name}
        self.names = {s.name: (s.wrap.command if s.wrap else s.resource).format(step=s.name, **fmt)
                      for s in self.steps}
        self.wraps = {s.name: (s.wrap.type, s.wrap.name.format(**fmt)) for s in self.steps if s.wrap}


def _after(step: Step, vm: _Vm, replicas: list[list[_Vm]]) -> tuple[str, ...]:
    """`step.after`'s tokens as resource names (model.Step documents them); what is off resolves to nothing."""
    out: list[str] = []
    p = vm.place
    for token in step.after:
        name, _, scope = token.partition("@")
        if token == "@rules":
            out.append(f"{vm.resource}/rules")
        elif not scope:
            out += [vm.names[name]] if name in vm.names else []
        elif p.front and scope != "every-replica":
            continue
        elif scope == "head" and p.rank > 0:
            out += [n for n in [replicas[p.replica][0].names.get(name)] if n]
        elif scope == "every-node" and not p.front:
            out += [n for v in replicas[p.replica] for n in [v.names.get(name)] if n]
        elif scope == "previous-replica" and p.rank == 0 and p.replica > 0:
            out += [n for n in [replicas[p.replica - 1][0].names.get(name)] if n]
        elif scope == "every-peer" and not p.front:
            out += [n for r in replicas for v in r for n in [v.names.get(name)] if n]
        elif scope == "every-replica":
            out += [n for r in replicas for n in [r[0].names.get(name)] if n]
    return tuple(out)


def resolve_vms(shape: StackShape, timing: Timing, name: str) -> tuple[VmPlan, ...]:
    """Every VM's plan, replica after replica, rank after rank, then the front; each step's clock from `timing`."""
    replicas = [[_Vm(shape, name, Place(r, rank)) for rank in range(shape.nodes)] for r in range(shape.replicas)]
    vms = [vm for group in replicas for vm in group]
    if shape.has_front:
        vms.append(_Vm(shape, name, Place(-1, 0, front=True)))
    sharing = shape.fan_out > 1
    plans = []
    for vm in vms:
        kind = FRONT if vm.place.front else NODE
        steps = tuple(StepPlan(
            step=s.name, resource=vm.names[s.name],
            parent=vm.resource if s.parent.get(kind, "vm") == "vm" else None,
            clock=clock(s.name, timing), after=_after(s, vm, replicas),
            stdin=tuple(k for k in s.stdin if k != "peer_token" or sharing), names_vm=s.names_vm,
            wrap=vm.wraps.get(s.name)) for s in vm.steps)
        plans.append(VmPlan(
            resource=vm.resource, name=vm.hs_name, kind=kind, replica=vm.place.replica, rank=vm.place.rank,
            # Behind a front the fan-out spans every replica: a node's place in it is not its rank.
            peer_rank=vm.place.replica * shape.nodes + vm.place.rank if shape.has_front and not vm.place.front
            else None,
            component=FRONT_TYPE if vm.place.front else GPU_NODE_TYPE, steps=steps))
    return tuple(plans)
