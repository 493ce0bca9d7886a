"""The step table's shapes, and the resolved plan's: plain frozen data, no Pulumi and no Settings in any field.

A `Step` is one entry of the table (kimi_cluster/plan/steps/table.py). `resolve_vms` (resolve.py) turns the table
and the settings, once, into one `VmPlan` per VM (every GPU node of every replica, and the front), each with its
ordered `StepPlan`s: resource name, parent, clock, dependencies by resource name, stdin secrets by key. What a
script says that only deploy time knows (addresses, peers, the certificate, VM ids) arrives as one `VmSpot`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kimi_cluster.plan.step_scripts import NodeSpot, ProxyTls

if TYPE_CHECKING:
    from kimi_cluster.settings import Settings
    from kimi_cluster.settings.timing import TimedSettings, Timing

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


def always(_settings: Settings, _place: Place) -> bool:
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
class View:
    """What of its VM's spot a step reads (`reads`, VmSpot fields), and the NodeSpot it makes of them."""

    reads: tuple[str, ...]
    make: Callable[[VmPlan, VmSpot], NodeSpot]


@dataclass(frozen=True)
class Floor:
    """The least a step's own work takes (kimi_cluster/settings/work_model.py), and what that work is: a
    kimi-cluster:stepDeadlineMinutes below it would stop the step mid-way every time (kimi_cluster/plan/admission.py
    refuses it)."""

    seconds: Callable[[Settings], float]
    work: str


ValueBuilder = Callable[["Settings", str, NodeSpot, "Timing", int], dict[str, Any]]


@dataclass(frozen=True)
class Step:
    """One node step, declared once: what it is, what it renders, how long it may run, where and when it runs, what
    it waits on, what it reads on stdin, and how its resource is named and parented.

    `after`: step names on the same VM (a step that is off is skipped), or `step@head` (this replica's head),
    `step@every-node` (every node of this replica), `step@previous-replica` (the previous replica's head),
    `step@every-replica` (every replica's head), `@rules` (this VM's firewall rules).
    `view`: the VmSpot fields its script reads (the program waits for those alone, so a step that reads less
    depends on less), and the NodeSpot its value builder gets from them.
    `parent`: "vm" (the VM's own component: GpuNode or Front) or "cluster", by where the step lands.
    """

    name: str
    summary: str
    build: ValueBuilder
    deadline: Callable[[Timing, TimedSettings], int]
    where: str
    view: View
    when: Callable[[Settings, Place], bool] = always
    after: tuple[str, ...] = ()
    stdin: tuple[str, ...] = ()
    resource: str = "{vm}-{step}"
    parent: Mapping[str, str] = field(default_factory=lambda: {"node": "vm", "front": "vm"})
    wrap: Wrap | None = None
    names_vm: bool = True  # the command text names the VM's id: a re-created VM runs it again
    suffix: Callable[[Settings], str] | None = None  # appended to the script (e.g. an identity that re-runs it)
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
class VmSpot:
    """What deploy time knows of one VM for its scripts. `tls`: the endpoint's certificate, on the VM holding it;
    `peer_ips`: every GPU node's private address when the download is shared; `front_upstreams`: the replica heads'
    private addresses, on the front; `gpu_vm_ids`: the GPU VMs' ids, on the endpoint's VM (the caretaker)."""

    private_ip: str = ""
    head_private_ip: str = ""
    public_ip: str = "<head-public-ip>"
    tls: ProxyTls | None = None
    peer_ips: Sequence[str] | None = None
    front_upstreams: Sequence[str] | None = None
    gpu_vm_ids: str | None = None
