"""The status report as the operator reads it: the text of one report (`format_report`), the loop that gathers
and prints it once or every few seconds (`run`), and the Hyperstack client it asks (`api_client`).

The report itself is gathered by kimi_cluster/operator/status_gather.py; how node commands run is the caller's
`NodeRunner` (SSH with the stack's pinned host keys, or the sandbox's local node execution), so this module reaches
nodes only through what it is given. `kimi-cluster status` and `kimi-cluster sandbox status` print with it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from kimi_cluster.hyperstack_api.api import API_URL_CONFIG, ApiSettings, HyperstackClient, HyperstackError
from kimi_cluster.operator.caretaker_status import format_caretaker
from kimi_cluster.operator.node_exec import NodeRunner
from kimi_cluster.operator.stack_state import StackState
from kimi_cluster.operator.status_gather import Sample, gather, printable, samples
from kimi_cluster.operator.status_replicas import format_replicas
from kimi_cluster.settings import Settings

EXIT_OK = 0


def project_dir() -> Path:
    """The Pulumi project the operator stands in, as for the Pulumi CLI: the current directory, where the stack's
    Pulumi.<stack>.yaml and its config live."""
    return Path.cwd()


def _bytes(n: float | None) -> str:
    if n is None:
        return "?"
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.2f} {unit}"
        n /= 1000
    return f"{n:.2f} TB"


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    return f"{hours}h{rest // 60:02d}m" if hours else f"{rest // 60}m{rest % 60:02d}s"


def _weights(w: Mapping[str, Any] | None) -> str:
    if not w:
        return "-"
    text = f"{_bytes(w['bytes_done'])} / {_bytes(w.get('bytes_total'))}"
    if w.get("percent") is not None:
        text += f" {w['percent']:.1f}%"
    if w.get("rate_bytes_s") and w.get("percent") != 100.0:
        text += f" {_bytes(w['rate_bytes_s'])}/s"
    if w.get("eta_s") is not None and w.get("percent") != 100.0:
        text += f" ETA {_duration(w['eta_s'])}"
    return text


def _engine(e: Mapping[str, Any] | None) -> str:
    if not e:
        return "?"
    text = str(e.get("state"))
    if e.get("restart_count"):
        text += f" ({e['restart_count']} restarts)"
    return text


def format_report(report: Mapping[str, Any]) -> str:
    cost = report.get("cost_so_far_usd")
    hourly = report.get("hourly_cost_usd")
    head = (f"kimi-cluster status: stack {report['stack']}, {report.get('topology')} in "
            f"{report.get('region') or '?'}, up {_duration(report.get('uptime_s'))}")
    if hourly is not None and cost is not None:
        head += f", ${cost:,.2f} so far at ${hourly:,.2f}/h"
    elif hourly is not None:
        head += f", ${hourly:,.2f}/h (cost so far needs the VMs' creation times: set HYPERSTACK_API_KEY)"
    lines = [head]
    if report.get("hourly_cost_source"):
        lines.append(f"  price: {report['hourly_cost_source']}")
    rows = [("node", "VM", "up", "step", "weights", "engine")]
    for n in report["nodes"]:
        step = n["step"] if not n.get("probe_error") else f"? ({n['probe_error']})"
        rows.append((n["name"], str(n["vm"].get("status")), _duration(n.get("uptime_s")), step,
                     _weights(n.get("weights")), _engine(n.get("engine"))))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        lines.append("  " + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=False)) + "  " + row[-1])
    ep = report["endpoint"]
    text = f"endpoint {ep.get('url') or '-'}: health {ep.get('health')}"
    if "serves_model" in ep:
        text += ", serves the model" if ep["serves_model"] else f", does NOT serve the model (lists {ep.get('models')})"
    traffic = [f"{ep[k]:,} {label}" for k, label in (("requests", "requests"), ("prompt_tokens", "prompt tokens"),
                                                   ("generation_tokens", "generated tokens")) if k in ep]
    if traffic:
        text += "; " + ", ".join(traffic)
    if not ep.get("ready_output"):
        text += " (readiness not passed yet: no endpoint_url output)"
    lines.append(text)
    if report.get("token_cost"):
        lines.append(f"tokens: {report['token_cost']['summary']}")
    if report.get("replicas"):
        lines.extend(format_replicas(report["replicas"]))
    if report.get("caretaker"):
        lines.extend(format_caretaker(report["caretaker"]))
    if (report.get("release") or {}).get("note"):
        lines.append(f"release: {report['release']['note']}")
    if report.get("advice"):
        lines.append(f"advice: {report['advice']}")
    # Node and endpoint text was made printable when it was read; this also covers the API's and the state's.
    return "\n".join(printable(line, 100_000) for line in lines)


# ---- where things come from --------------------------------------------------------------------------------------

def _pulumi_config(stack: str, key: str) -> str | None:
    try:
        done = subprocess.run(["pulumi", "config", "get", key, "--stack", stack], cwd=project_dir(),
                              capture_output=True, text=True, timeout=60)
    except (FileNotFoundError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 and done.stdout.strip() else None


def api_client(stack: str, stack_config: Mapping[str, Any]) -> HyperstackClient | None:
    """The environment first (HYPERSTACK_*), then the stack's own config; None when no key is to be had."""
    config = {k: v for k, v in stack_config.items() if k == API_URL_CONFIG and isinstance(v, str)}
    if not os.environ.get("HYPERSTACK_API_KEY"):
        key = _pulumi_config(stack, "hyperstack:apiKey")
        if key:
            config["hyperstack:apiKey"] = key
    try:
        return HyperstackClient.from_settings(ApiSettings.resolve(config), timeout=(5.0, 15.0))
    except HyperstackError:
        return None


def run(state_loader: Callable[[], StackState], settings: Settings, runner: NodeRunner, api: HyperstackClient | None, *,
        as_json: bool, watch: float | None, out: Any = sys.stdout) -> int:
    previous: dict[str, Sample] = {}
    try:
        while True:
            state: StackState = state_loader()
            report = gather(state, settings, runner, api, previous)
            previous = samples(report)
            text = json.dumps(report, indent=2) if as_json else format_report(report)
            if watch and not as_json and getattr(out, "isatty", lambda: False)():
                out.write("\x1b[H\x1b[2J")
            out.write(text + "\n")
            out.flush()
            if not watch:
                return EXIT_OK
            time.sleep(watch)
    except KeyboardInterrupt:
        return EXIT_OK
