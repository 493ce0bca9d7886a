"""The one renderer of node scripts: every script a VM runs, from its resolved plan and where it stands.

`render_vm_scripts` is pure. The program calls it inside Output.apply once the addresses, peers, the certificate
and the VM ids are known (kimi_cluster/deploy/cluster.py); `kimi-cluster plan --render-dir` calls it with
placeholder spots (kimi_cluster/operator/plan_report.py). So both write the same scripts for the same spot.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from kimi_cluster.plan.render import render
from kimi_cluster.plan.step_scripts import PLAN_PUBLIC_IP, PLAN_TLS, NodeSpot, ProxyTls, common_values
from kimi_cluster.plan.steps.clocks import deadline_s
from kimi_cluster.plan.steps.model import View, VmPlan, VmSpot
from kimi_cluster.plan.steps.table import BY_NAME, NAMES
from kimi_cluster.settings import Settings
from kimi_cluster.settings.timing import Timing


def render_spot_step(settings: Settings, step: str, spot: NodeSpot, timing: Timing | None = None) -> str:
    """One step's script for the node at `spot`: the shared values, then the step's own, then any suffix."""
    entry = BY_NAME.get(step)
    if entry is None:
        raise ValueError(f"unknown step {step!r}; steps are {', '.join(NAMES)}")
    timing = settings.timing if timing is None else timing
    values = common_values(settings, spot.rank, step, entry.summary, timing)
    values.update(entry.build(settings, step, spot, timing, deadline_s(step, timing, settings)))
    text = render(entry.template_name, **values)
    return text + entry.suffix(settings) if entry.suffix is not None else text


def render_vm_scripts(settings: Settings, vm: VmPlan, spot: VmSpot, steps: Sequence[str] | None = None,
                      timing: Timing | None = None) -> dict[str, str]:
    """Every script `vm` runs (or those of `steps`), by step, in order: each step sees of `spot` only the fields
    its table entry reads, so a spot that holds only those renders the same script. `timing` defaults to the
    stack's own."""
    return {s.step: render_spot_step(settings, s.step, _seen(BY_NAME[s.step].view, vm, spot), timing)
            for s in vm.steps if steps is None or s.step in steps}


def _seen(view: View, vm: VmPlan, spot: VmSpot) -> NodeSpot:
    return view.make(vm, VmSpot(**{f: getattr(spot, f) for f in view.reads}))


# ---- field by field, for the tests and the operator's tools ---------------------------------------------------------


def render_step(settings: Settings, step: str, rank: int = 0, private_ip: str = "", head_private_ip: str = "",
                timing: Timing | None = None, tls: ProxyTls = PLAN_TLS, public_ip: str = PLAN_PUBLIC_IP,
                peer_ips: Sequence[str] | None = None, *, container: str | None = None,
                identity: str | None = None, peer_rank: int | None = None) -> str:
    """`render_spot_step` with the spot given field by field; `timing` defaults to the stack's own."""
    spot = NodeSpot(rank=rank, private_ip=private_ip, head_private_ip=head_private_ip, tls=tls, public_ip=public_ip,
                    peer_ips=peer_ips, peer_rank=peer_rank, container=container, identity=identity)
    return render_spot_step(settings, step, spot, timing)


def render_front_step(settings: Settings, step: str, head_private_ips: Sequence[str], tls: ProxyTls,
                      timing: Timing | None = None) -> str:
    """One of the front's scripts (front-ready, proxy, readiness), for these replica heads."""
    return render_spot_step(settings, step, NodeSpot(tls=tls, front_upstreams=list(head_private_ips)), timing)


def render_node_scripts(settings: Settings, rank: int, private_ip: str, head_private_ip: str,
                        timing: Timing | None = None, tls: ProxyTls = PLAN_TLS,
                        public_ip: str = PLAN_PUBLIC_IP, peer_ips: Sequence[str] | None = None,
                        peer_rank: int | None = None, replica: int = 0) -> dict[str, str]:
    """Every script node `rank` of `replica` runs, by step, in order (render_vm_scripts with this spot)."""
    from kimi_cluster.plan.steps.resolve import resolve_vms

    vm = next(v for v in resolve_vms(settings, "kimi") if v.replica == replica and v.rank == rank)
    if peer_rank is not None:
        vm = dataclasses.replace(vm, peer_rank=peer_rank)
    spot = VmSpot(private_ip=private_ip, head_private_ip=head_private_ip, public_ip=public_ip,
                  tls=tls if rank == 0 and replica == 0 and not settings.has_front else None, peer_ips=peer_ips)
    return render_vm_scripts(settings, vm, spot, timing=timing)
