"""The step table's shapes, and the resolved plan's: plain frozen data, no Pulumi and no Settings in any field.

A `Step` is one entry of the table (kimi_cluster/plan/steps/table.py); it names the frozen inputs its value builder
reads. The blueprint (kimi_cluster/blueprint/) compiles the settings once into `CompiledSteps`: the stack's
`StackShape` (what decides which steps run where), its resolved `Timing`, and each step's inputs. `resolve_vms`
(resolve.py) turns the table and the shape into one `VmPlan` per VM (every GPU node of every replica, and the
front), each with its ordered `StepPlan`s: resource name, parent, clock, dependencies by resource name, stdin secrets
by key. What a script says that only deploy time knows (addresses, peers, the certificate, VM ids) arrives as one
`VmSpot`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kimi_cluster.plan.step_scripts import CommonInputs
from kimi_cluster.settings.timing import Timing

# Where a step runs.
NODE = "node"  # every GPU node of every replica
HEAD = "head"  # rank 0 of every replica
FRONT = "front"  # the front VM (replicas >= 2)
ENDPOINT = "endpoint"  # the VM that holds the endpoint: replica 0's head with one replica, else the front

# The component types a step's resource sits in (the URNs of a live stack name them: never change one).
GPU_NODE_TYPE = "kimi:cluster:GpuNode"
READINESS_TYPE = "kimi:cluster:Readiness"
KERNEL_CACHE_SAVE_TYPE = "kimi:cluster:KernelCacheSave"
FRONT_TYPE = "kimi:cluster:Front"


@dataclass(frozen=True)
class Place:
    """Where a VM stands in the stack, for a step's `when`: its replica and rank (the front: replica -1)."""

    replica: int
    rank: int
    front: bool = False


@dataclass(frozen=True)
class StackShape:
    """What decides which steps a stack runs, where, and how its VMs are named: the step table's `when`, its
    floors and `resolve_vms` read this alone. `node_names[replica][rank]` are the GPU VMs' Hyperstack names."""

    nodes: int
    replicas: int
    has_front: bool
    resumes_streams: bool
    kernel_cache: bool
    kernel_warmup: bool
    guarded: bool  # idleStopMinutes or budgetUsd: the caretaker runs
    fan_out: int  # how many GPU nodes share one download
    node_names: tuple[tuple[str, ...], ...]
    front_name: str


@dataclass(frozen=True)
class CompiledSteps:
    """The plan of every node step, compiled once from the settings by the blueprint: the stack's shape, its
    resolved timing, what every step's script shares, and each step's frozen inputs by step name (only the steps
    this stack runs)."""

    shape: StackShape
    timing: Timing
    common: CommonInputs
    inputs: Mapping[str, Any]


def always(_shape: StackShape, _place: Place) -> bool:
    """The `when` of a step that every stack runs."""
    return True


@dataclass(frozen=True)
class Wrap:
    """The one-step component a step's command sits in: its type, its name and the command's, as patterns over
    {stack} (the cluster's name), {group} (the replica's prefix, or the front's VM name) and {vm}."""

    type: str
    name: str
    command: str


@dataclass(frozen=True)
class Floor:
    """The least a step's own work takes (kimi_cluster/settings/work_model.py), and what that work is: a
    kimi-cluster:stepDeadlineMinutes below it would stop the step mid-way every time (kimi_cluster/plan/admission.py
    refuses it)."""

    seconds: Callable[[StackShape], float]
    work: str


# A step's value builder: (its inputs, the VM's spot, the timing, its deadline in seconds, the step's name) -> the
# values its template gets beside the shared ones.
ValueBuilder = Callable[[Any, "VmSpot", Timing, int, str], dict[str, Any]]


@dataclass(frozen=True)
class Step:
    """One node step, declared once: what it is, what it renders, how long it may run, where and when it runs, what
    it waits on, what it reads on stdin, and how its resource is named and parented.

    `after`: step names on the same VM (a step that is off is skipped), or `step@head` (this replica's head),
    `step@every-node` (every node of this replica), `step@previous-replica` (the previous replica's head),
    `step@every-replica` (every replica's head), `step@every-peer` (every GPU node the download's fan-out spans:
    every node of every replica), `@rules` (this VM's firewall rules).
    `inputs`: the frozen type the blueprint fills for it (kimi_cluster/blueprint/inputs.py), which `build` and
    `suffix` read. `reads`: the VmSpot fields its script reads (the program waits for those alone, so a step that
    reads less depends on less).
    `parent`: "vm" (the VM's own component: GpuNode or Front) or "cluster", by where the step lands.
    """

    name: str
    summary: str
    inputs: type
    build: ValueBuilder
    deadline: Callable[[Timing], int]
    where: str
    reads: tuple[str, ...]
    when: Callable[[StackShape, Place], bool] = always
    after: tuple[str, ...] = ()
    stdin: tuple[str, ...] = ()
    resource: str = "{vm}-{step}"
    parent: Mapping[str, str] = field(default_factory=lambda: {"node": "vm", "front": "vm"})
    wrap: Wrap | None = None
    names_vm: bool = True  # the command text names the VM's id: a re-created VM runs it again
    suffix: Callable[[Any], str] | None = None  # from its inputs, appended (e.g. an identity that re-runs it)
    template: str = ""  # default: <name>.sh.j2
    timing_keys: str = ""  # the nodeTiming keys its default deadline is made of (admission bounds them to a week)
    floor: Floor | None = None  # the least its own work takes; none: the one-minute floor of every step (rules.py)

    @property
    def template_name(self) -> str:
        return self.template or f"{self.name}.sh.j2"


@dataclass(frozen=True)
class Clock:
    """A step's deadline on the node, and the custom timeout that bounds its SSH dial."""

    deadline_s: int
    timeout: str


@dataclass(frozen=True)
class StepPlan:
    """One step resolved for one VM. `after`: resource names (a step's command, or `<vm>/rules`)."""

    step: str
    resource: str
    parent: str | None  # the component it is a child of, by resource name; None: the cluster
    clock: Clock
    after: tuple[str, ...]
    stdin: tuple[str, ...]
    names_vm: bool
    wrap: tuple[str, str] | None = None  # (component type, component name) of its one-step component


@dataclass(frozen=True)
class VmPlan:
    """One VM and its steps, in the order they are made (each after what it waits on)."""

    resource: str  # the VM's resource name, and its own component's (GpuNode, Front)
    name: str  # its Hyperstack name (the render dir's folder)
    kind: str  # NODE or FRONT
    replica: int
    rank: int
    peer_rank: int | None
    component: str  # GPU_NODE_TYPE or FRONT_TYPE
    steps: tuple[StepPlan, ...]


@dataclass(frozen=True)
class ProxyTls:
    """The public half of the endpoint's TLS material: the server certificate chain and the CA clients trust."""

    cert_chain_pem: str
    ca_pem: str


# What the offline plan and the tests render when no certificate exists yet.
PLAN_TLS = ProxyTls("<the server certificate chain, made at deploy time>\n", "<the stack's CA certificate>\n")
PLAN_PUBLIC_IP = "<head-public-ip>"


@dataclass(frozen=True)
class VmSpot:
    """Where one VM stands, as its scripts see it: its rank and place in the download's fan-out (from its VmPlan),
    and what deploy time knows of it. `tls`: the endpoint's certificate, on the VM holding it; `peer_ips`: every GPU
    node's private address when the download is shared (`peer_rank` is this node's place among them: behind a front
    the fan-out spans every replica; None: its rank); `front_upstreams`: the replica heads' private addresses, on the
    front (it makes the proxy and readiness steps the front's); `gpu_vm_ids`: the GPU VMs' ids, on the endpoint's VM
    (the caretaker); `group_vm_ids`: the VM ids of this node's engine group (its replica), in rank order: a VM
    that is new there runs the group's weights, launch and readiness steps again."""

    rank: int = 0
    peer_rank: int | None = None
    private_ip: str = ""
    head_private_ip: str = ""
    public_ip: str = PLAN_PUBLIC_IP
    tls: ProxyTls = PLAN_TLS
    peer_ips: Sequence[str] | None = None
    front_upstreams: Sequence[str] | None = None
    gpu_vm_ids: str | None = None
    group_vm_ids: str | None = None
