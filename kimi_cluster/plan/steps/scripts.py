"""The one renderer of node scripts: every script a VM runs, from the compiled steps and where the VM stands.

Pure, and no settings: it reads the `CompiledSteps` the blueprint made (kimi_cluster/blueprint/) and one `VmSpot`.
The program calls it inside Output.apply once the addresses, peers, the certificate and the VM ids are known
(kimi_cluster/deploy/cluster.py); `kimi-cluster plan --render-dir` calls it with placeholder spots
(kimi_cluster/operator/plan_report.py), on the same compiled steps. So both write the same scripts for the same spot.
"""

from __future__ import annotations

from collections.abc import Sequence

from kimi_cluster.plan.jinja import render
from kimi_cluster.plan.step_scripts import common_values
from kimi_cluster.plan.steps.clocks import deadline_s
from kimi_cluster.plan.steps.model import CompiledSteps, Step, VmPlan, VmSpot
from kimi_cluster.plan.steps.table import BY_NAME, NAMES
from kimi_cluster.settings.timing import Timing


def render_spot_step(steps: CompiledSteps, step: str, spot: VmSpot, timing: Timing | None = None) -> str:
    """One step's script for the VM at `spot`: the shared values, then the step's own, then any suffix. `timing`
    defaults to the compiled one."""
    entry = BY_NAME.get(step)
    if entry is None:
        raise ValueError(f"unknown step {step!r}; steps are {', '.join(NAMES)}")
    inputs = steps.inputs.get(step)
    if inputs is None:
        raise ValueError(f"step {step!r} is off in this stack; it runs {', '.join(steps.inputs)}")
    timing = steps.timing if timing is None else timing
    values = common_values(steps.common, spot.rank, step, entry.summary, timing)
    values.update(entry.build(inputs, spot, timing, deadline_s(step, timing), step))
    text = render(entry.template_name, **values)
    return text + entry.suffix(inputs) if entry.suffix is not None else text


def render_vm_scripts(steps: CompiledSteps, vm: VmPlan, spot: VmSpot, only: Sequence[str] | None = None,
                      timing: Timing | None = None) -> dict[str, str]:
    """Every script `vm` runs (or those of `only`), by step, in order: each step sees of `spot` only the fields its
    table entry reads, so a spot that holds only those renders the same script."""
    return {s.step: render_spot_step(steps, s.step, seen(BY_NAME[s.step], vm, spot), timing)
            for s in vm.steps if only is None or s.step in only}


def seen(entry: Step, vm: VmPlan, spot: VmSpot) -> VmSpot:
    """What `entry`'s script sees of `spot`: the VM's rank and place in the fan-out, and the fields it reads."""
    return VmSpot(rank=vm.rank, peer_rank=vm.peer_rank, **{f: getattr(spot, f) for f in entry.reads})
