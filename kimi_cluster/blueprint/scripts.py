"""The settings' scripts, for the tests and the operator's tools: the node steps compiled from the settings
(inputs.py), then the one pure renderer (kimi_cluster/plan/steps/scripts.py) at a spot given field by field.

Every step here has its inputs, whether or not the stack runs it: a test may render a step its settings leave off.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from kimi_cluster.blueprint.inputs import resolved_timing, stack_shape, step_inputs
from kimi_cluster.plan.step_scripts import CommonInputs
from kimi_cluster.plan.steps.model import PLAN_PUBLIC_IP, PLAN_TLS, CompiledSteps, ProxyTls, VmSpot
from kimi_cluster.plan.steps.resolve import resolve_vms
from kimi_cluster.plan.steps.scripts import render_spot_step, render_vm_scripts
from kimi_cluster.settings import Settings
from kimi_cluster.settings.timing import Timing


def every_step(settings: Settings, timing: Timing | None = None) -> CompiledSteps:
    """The compiled steps with every step's inputs (`timing`, default the stack's own, resolved against them)."""
    return CompiledSteps(stack_shape(settings), resolved_timing(settings, timing),
                         CommonInputs(settings.node_root, settings.storage_path), step_inputs(settings))


def render_step(settings: Settings, step: str, rank: int = 0, private_ip: str = "", head_private_ip: str = "",
                timing: Timing | None = None, tls: ProxyTls = PLAN_TLS, public_ip: str = PLAN_PUBLIC_IP,
                peer_ips: Sequence[str] | None = None, *, identity: str | None = None,
                peer_rank: int | None = None) -> str:
    """One step's script at the spot given field by field (`identity`: the caretaker's GPU VM ids)."""
    spot = VmSpot(rank=rank, private_ip=private_ip, head_private_ip=head_private_ip, tls=tls, public_ip=public_ip,
                  peer_ips=peer_ips, peer_rank=peer_rank, gpu_vm_ids=identity)
    return render_spot_step(every_step(settings, timing), step, spot)


def render_front_step(settings: Settings, step: str, head_private_ips: Sequence[str], tls: ProxyTls,
                      timing: Timing | None = None) -> str:
    """One of the front's scripts (front-ready, proxy, readiness), for these replica heads."""
    return render_spot_step(every_step(settings, timing), step, VmSpot(tls=tls, front_upstreams=list(head_private_ips)))


def render_node_scripts(settings: Settings, rank: int, private_ip: str, head_private_ip: str,
                        timing: Timing | None = None, tls: ProxyTls = PLAN_TLS,
                        public_ip: str = PLAN_PUBLIC_IP, peer_ips: Sequence[str] | None = None,
                        peer_rank: int | None = None, replica: int = 0,
                        group_vm_ids: str | None = None) -> dict[str, str]:
    """Every script node `rank` of `replica` runs, by step, in order (render_vm_scripts with this spot;
    `group_vm_ids`: its engine group's VM ids)."""
    steps = every_step(settings, timing)
    vm = next(v for v in resolve_vms(steps.shape, steps.timing, "kimi") if v.replica == replica and v.rank == rank)
    if peer_rank is not None:
        vm = dataclasses.replace(vm, peer_rank=peer_rank)
    spot = VmSpot(private_ip=private_ip, head_private_ip=head_private_ip, public_ip=public_ip, tls=tls,
                  peer_ips=peer_ips, group_vm_ids=group_vm_ids)
    return render_vm_scripts(steps, vm, spot)
