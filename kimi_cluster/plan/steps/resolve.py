"""The step table resolved against the settings, once: one `VmPlan` per VM, every node of every replica and the
front, each with its ordered steps, their resource names, parents, clocks, dependencies and stdin keys.

Plain data only: no Settings travels past here. Naming follows what a live stack already holds (its URNs): replica
0 is named as a one-replica stack (kimi-node0, kimi-ready), replica r >= 1 kimi-r<r>-node<rank>, the front
kimi-front.
"""

from __future__ import annotations

from kimi_cluster.plan.step_scripts import fan_out_size
from kimi_cluster.plan.steps.clocks import clock
from kimi_cluster.plan.steps.model import (
    ENDPOINT,
    FRONT,
    FRONT_TYPE,
    GPU_NODE_TYPE,
    HEAD,
    NODE,
    Place,
    Step,
    StepPlan,
    VmPlan,
)
from kimi_cluster.plan.steps.table import TABLE
from kimi_cluster.settings import Settings


def replica_prefix(name: str, replica: int) -> str:
    return name if replica == 0 else f"{name}-r{replica}"


def _runs_here(step: Step, settings: Settings, place: Place) -> bool:
    if place.front:
        where = step.where == FRONT or step.where == ENDPOINT and settings.has_front
    else:
        where = (step.where == NODE or step.where == HEAD and place.rank == 0
                 or step.where == ENDPOINT and not settings.has_front and place.rank == 0 and place.replica == 0)
    return where and step.when(settings, place)


class _Vm:
    """A VM while its plan is worked out: where it stands, and its steps' resource names by step."""

    def __init__(self, settings: Settings, name: str, place: Place) -> None:
        self.place = place
        if place.front:
            self.resource, self.group, self.hs_name = f"{name}-front", f"{name}-front", settings.front_name
        else:
            self.group = replica_prefix(name, place.replica)
            self.resource = f"{self.group}-node{place.rank}"
            self.hs_name = settings.replica_node_name(place.replica, place.rank)
        self.steps = [s for s in TABLE if _runs_here(s, settings, place)]
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
        elif scope == "every-replica":
            out += [n for r in replicas for n in [r[0].names.get(name)] if n]
    return tuple(out)


def resolve_vms(settings: Settings, name: str) -> tuple[VmPlan, ...]:
    """Every VM's plan, replica after replica, rank after rank, then the front."""
    replicas = [[_Vm(settings, name, Place(r, rank)) for rank in range(settings.nodes)]
                for r in range(settings.replicas)]
    vms = [vm for group in replicas for vm in group]
    if settings.has_front:
        vms.append(_Vm(settings, name, Place(-1, 0, front=True)))
    sharing = fan_out_size(settings) > 1
    timing = settings.timing
    plans = []
    for vm in vms:
        kind = FRONT if vm.place.front else NODE
        steps = tuple(StepPlan(
            step=s.name, resource=vm.names[s.name],
            parent=vm.resource if s.parent.get(kind, "vm") == "vm" else None,
            clock=clock(s.name, timing, settings), after=_after(s, vm, replicas),
            stdin=tuple(k for k in s.stdin if k != "peer_token" or sharing), names_vm=s.names_vm,
            wrap=vm.wraps.get(s.name)) for s in vm.steps)
        plans.append(VmPlan(
            resource=vm.resource, name=vm.hs_name, kind=kind, replica=vm.place.replica, rank=vm.place.rank,
            # Behind a front the fan-out spans every replica: a node's place in it is not its rank.
            peer_rank=vm.place.replica * settings.nodes + vm.place.rank if settings.has_front and not vm.place.front
            else None,
            component=FRONT_TYPE if vm.place.front else GPU_NODE_TYPE, steps=steps))
    return tuple(plans)
