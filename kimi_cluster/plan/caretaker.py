"""The caretaker (idleStopMinutes, budgetUsd), plan side: its step's inputs and value builder, and its files.

It runs where the endpoint is: on the front when replicas >= 2, else on replica 0's head, as systemd unit
kimi-caretaker (kimi_cluster/node/caretaker.py, shipped with kimi_cluster/node/caretaker_spend.py as weights.sh.j2 ships
the
download). Its step runs once the endpoint's readiness wait passed (the proxy's Caddyfile logs the requests it counts
and answers its 503, kimi_cluster/plan/templates/_caretaker.Caddyfile.j2); the step's text names every GPU VM's id, so
it runs again
(and arms the caretaker afresh) whenever an `up` re-creates one. Its Hyperstack key arrives on the step's stdin only.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

from kimi_cluster.plan.proxy import CA_FILE, CARETAKER_DIR
from kimi_cluster.plan.step_scripts import _ROOT, source
from kimi_cluster.plan.steps.model import VmSpot
from kimi_cluster.settings.timing import Timing

UNIT = "kimi-caretaker"
STATE_DIR = "caretaker"  # under the node's /var/lib/kimi-cluster: config.json, state.json
STATE_FILE = "state.json"
KEY_FILE = "caretaker_api_key"  # under /etc/kimi-cluster, root only
RESTART_SECONDS = 5  # systemd's RestartSec: a killed caretaker is back within this
CARETAKER_SOURCE = _ROOT / "kimi_cluster" / "node" / "caretaker.py"
# The billing history's reading and the caretaker's Hyperstack calls, shipped beside it.
SPEND_SOURCE = _ROOT / "kimi_cluster" / "node" / "caretaker_spend.py"
CARETAKER_API_SOURCE = _ROOT / "kimi_cluster" / "node" / "caretaker_api.py"
# With working hours (kimi-cluster:schedule) the unit runs caretaker_hours.py, which wraps the caretaker's poll with
# the stop at a window's end; without, neither file ships and the step's text is what it was.
# Each lands at its path under the program's folder; caretaker.py also as a module, for caretaker_hours.py to import.
HOURS_SOURCES = (("kimi_cluster/node/working_hours.py", _ROOT / "kimi_cluster" / "node" / "working_hours.py"),
                 ("kimi_cluster/node/caretaker.py", CARETAKER_SOURCE),
                 ("caretaker_hours.py", _ROOT / "kimi_cluster" / "node" / "caretaker_hours.py"))
# With schedule.earlyStart the unit runs caretaker_early.py, which wraps caretaker_hours.py's poll with the asks'
# record; caretaker_hours.py ships as a module too, for it to import.
EARLY_SOURCES = (("kimi_cluster/node/caretaker_hours.py", _ROOT / "kimi_cluster" / "node" / "caretaker_hours.py"),
                 ("caretaker_early.py", _ROOT / "kimi_cluster" / "node" / "caretaker_early.py"))


@dataclass(frozen=True)
class CaretakerInputs:
    """What the caretaker step reads: its configuration (kimi_cluster/blueprint/caretaker.py `config`: no secret,
    no node path) and the guards it keeps, in words."""

    config_json: str
    idle_stop_minutes: int | None
    budget_usd: float | None
    hours: bool = False  # kimi-cluster:schedule: the stop at a window's end
    early_start: bool = False  # schedule.earlyStart: the asks for an early up, recorded for the scheduler


def caretaker_values(inputs: CaretakerInputs, spot: VmSpot, _timing: Timing, _deadline_s: int,
                     _step: str) -> dict[str, Any]:
    # spot.gpu_vm_ids: the GPU VMs' ids, so that the step arms the caretaker again when an up re-creates one.
    guards = [f"idle stop after {inputs.idle_stop_minutes} min" if inputs.idle_stop_minutes else "",
              f"budget {inputs.budget_usd:,.2f} USD" if inputs.budget_usd else "",
              "stop at the end of each working window" if inputs.hours else "",
              "early starts asked for outside the hours" if inputs.early_start else ""]
    return {"unit": UNIT, "state_dir": STATE_DIR, "state_file": STATE_FILE,
            "key_file": KEY_FILE, "caretaker_dir": CARETAKER_DIR, "ca_file": CA_FILE,
            "config_b64": base64.b64encode(inputs.config_json.encode()).decode(),
            "restart_seconds": RESTART_SECONDS, "gpu_vm_ids": spot.gpu_vm_ids or "<the GPU VMs' ids>",
            "guards": ", ".join(g for g in guards if g), "program_source": source(CARETAKER_SOURCE),
            "spend_source": source(SPEND_SOURCE), "api_source": source(CARETAKER_API_SOURCE),
            "hours_sources": [(at, source(path)) for at, path in HOURS_SOURCES + (
                EARLY_SOURCES if inputs.early_start else ())] if inputs.hours else [],
            "program": "caretaker_early.py" if inputs.early_start else
                       "caretaker_hours.py" if inputs.hours else "caretaker.py"}
