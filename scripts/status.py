"""What a deployed cluster is doing: per node the VM, the step, the weights' progress and the engine; the endpoint;
uptime and cost so far; one line of advice when something is stuck.

    python -m scripts.status --stack NAME [--watch [SECONDS]] [--json] [--state FILE] [--node-exec FILE]

The state comes from `pulumi stack export --show-secrets` (or --state FILE, such a dump or the sandbox engine's
state file); nodes are reached over SSH with the stack's pinned host keys (or as --node-exec says node commands run,
the sandbox's setting); the VMs' state comes from the Hyperstack API when HYPERSTACK_API_KEY is set. The sandbox:
`python -m scripts.sandbox status`. No secret is ever printed.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from components.cluster_status import Sample, gather, printable, samples
from components.hyperstack.api import API_URL_CONFIG, HyperstackClient, HyperstackError
from components.hyperstack.api import Settings as ApiSettings
from components.node_exec import NodeRunner, SshRunner, remove_key_files_on_signals
from components.settings import Settings, SettingsError
from components.settings.loader import load_settings, read_stack_file
from components.stack_state import StackState, StackStateError, export_stack, load_state_file

PROJECT_DIR = Path(__file__).resolve().parents[1]
EXIT_OK, EXIT_USAGE = 0, 2
# --watch: more often than once a second only loads the nodes; a day apart is no longer watching.
WATCH_MIN_S, WATCH_MAX_S = 1.0, 86400.0


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
        from components.replica_status import format_replicas

        lines.extend(format_replicas(report["replicas"]))
    if report.get("advice"):
        lines.append(f"advice: {report['advice']}")
    # Node and endpoint text was made printable when it was read; this also covers the API's and the state's.
    return "\n".join(printable(line, 100_000) for line in lines)


# ---- where things come from --------------------------------------------------------------------------------------

def _pulumi_config(stack: str, key: str) -> str | None:
    try:
        done = subprocess.run(["pulumi", "config", "get", key, "--stack", stack], cwd=PROJECT_DIR,
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


def node_runner(node_exec: str | None) -> NodeRunner:
    """SSH, or what the --node-exec file says; ValueError (one sentence naming the file) for a file it cannot use."""
    if not node_exec:
        return SshRunner()
    from sandbox.commands import NodeExecution  # commands run locally, one directory per host

    try:
        data = json.loads(Path(node_exec).read_text(encoding="utf-8"))
    except OSError as err:
        raise ValueError(f"--node-exec {node_exec}: {err.strerror or err}") from None
    except ValueError:
        raise ValueError(f"--node-exec {node_exec} is not JSON (UTF-8 text holding one object)") from None
    if not isinstance(data, dict) or not isinstance(data.get("nodes_dir"), str) \
            or not isinstance(data.get("path_prefix") or [], list) or not isinstance(data.get("env") or {}, dict):
        raise ValueError(f"--node-exec {node_exec} is not an object with nodes_dir (a path) and optional path_prefix "
                         "(a list) and env (an object), as the sandbox writes it")
    try:
        return NodeExecution.from_json(data)
    except (TypeError, ValueError) as err:
        raise ValueError(f"--node-exec {node_exec}: {err}") from None


def run(state_loader: Any, settings: Settings, runner: NodeRunner, api: HyperstackClient | None, *,
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m scripts.status", description=__doc__.splitlines()[0])
    ap.add_argument("--stack", required=True)
    ap.add_argument("--watch", nargs="?", type=float, const=10.0, default=None, metavar="SECONDS",
                    help="refresh every SECONDS (default 10) until Ctrl-C")
    ap.add_argument("--json", action="store_true", help="print the status as JSON")
    ap.add_argument("--state", help="a stack state file instead of `pulumi stack export --show-secrets`")
    ap.add_argument("--config", help="the stack config file (default Pulumi.<stack>.yaml)")
    ap.add_argument("--node-exec", help="how node commands run, as JSON (default: SSH with the pinned host keys)")
    args = ap.parse_args(argv)
    # time.sleep refuses a negative or NaN interval only after the first report, and an infinite one never wakes.
    if args.watch is not None and not (math.isfinite(args.watch) and WATCH_MIN_S <= args.watch <= WATCH_MAX_S):
        print(f"error: --watch {args.watch:g} is not an interval of {WATCH_MIN_S:g} to {WATCH_MAX_S:g} seconds",
              file=sys.stderr)
        return EXIT_USAGE
    remove_key_files_on_signals()  # a closed terminal (SIGHUP) or a kill (SIGTERM) leaves no private key behind
    config_path = args.config or str(PROJECT_DIR / f"Pulumi.{args.stack}.yaml")
    try:
        raw, other = read_stack_file(config_path)
        settings = load_settings(raw, args.stack)
        runner = node_runner(args.node_exec)
    except (OSError, SettingsError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_USAGE

    def loader() -> StackState:
        return load_state_file(args.state, args.stack) if args.state else export_stack(args.stack, PROJECT_DIR)

    try:
        return run(loader, settings, runner, api_client(args.stack, other),
                   as_json=args.json, watch=args.watch)
    except StackStateError as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
