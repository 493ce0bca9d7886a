"""The cluster's status as data: per node the VM (API), the step in progress, the weights' progress and the engine
container; the endpoint's health and traffic; uptime and cost so far; one line of advice when something is stuck.

Gathered from three places, each optional: the Hyperstack API (VM state and creation time), each node (the probe
`kimi_cluster/node/node_status.py`, run the way the stack's node commands run), and the endpoint (HTTP, with the stack's
API key in the Authorization header only). Nothing secret is put into the result.

What a node or the endpoint answers is whatever runs there, a compromised engine included: the probe's JSON is
checked field by field (a wrong type is dropped, never raised on), and every string from a node or the endpoint has
its control, format and line-separator characters escaped (`printable`), so no escape sequence (an OSC 52
clipboard write, a title change) reaches the operator's terminal.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import requests

from kimi_cluster.blueprint.pricing import catalog_quote, token_cost
from kimi_cluster.hyperstack_api.api import HyperstackClient, HyperstackError
from kimi_cluster.node.printable import printable
from kimi_cluster.operator.caretaker_status import caretaker_view
from kimi_cluster.operator.engine_metrics import parse_metrics
from kimi_cluster.operator.node_exec import NodeRunner, probe_command
from kimi_cluster.operator.stack_state import NodeRecord, StackState
from kimi_cluster.operator.status_replicas import replicas_view
from kimi_cluster.release import release_view
from kimi_cluster.settings import Settings

PROBE = Path(__file__).resolve().parents[1] / "node" / "node_status.py"
STALL_SECONDS = 600          # no download progress for 10 minutes: stuck
CRASH_LOOP_RESTARTS = 3      # the engine restarted this often: crash-looping
PROBE_TIMEOUT_S = 60.0
HTTP_TIMEOUT_S = 10.0


@dataclass
class Sample:
    """An earlier reading of one node's bytes, for the rate between two refreshes of --watch."""

    at: float
    bytes_done: int


def _parse_time(value: Any) -> float | None:
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str) and value:
        try:
            return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
        except ValueError:
            return None
    return None


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _opt_text(value: Any) -> str | None:
    return None if value is None else printable(value)


def checked_probe(raw: Any) -> dict[str, Any]:
    """The probe's JSON as the shape kimi_cluster/node/node_status.py prints, whatever the node sent: fields of the
    wrong
    type are dropped or defaulted, strings made printable. Only what the status screen reads is kept."""
    if not isinstance(raw, dict):
        return {"error": "the probe printed JSON that is not an object"}
    steps = []
    listed = raw.get("steps")
    for s in listed if isinstance(listed, list) else []:
        if isinstance(s, dict) and isinstance(s.get("step"), str):
            steps.append({"step": printable(s["step"], 40), "started_at": _number(s.get("started_at")),
                          "running": s.get("running") is True})
    out: dict[str, Any] = {"steps": steps, "weights_unit": _opt_text(raw.get("weights_unit")),
                           "weights_log": _opt_text(raw.get("weights_log"))}
    w = raw.get("weights")
    if isinstance(w, dict) and _count(w.get("bytes_done")) is not None:
        updated = w.get("updated_at")
        out["weights"] = {
            "bytes_done": w["bytes_done"], "bytes_total": _count(w.get("bytes_total")) or None,
            "files_done": _count(w.get("files_done")), "files_total": _count(w.get("files_total")),
            "updated_at": _number(updated) if not isinstance(updated, str) else printable(updated, 40),
            "source": _opt_text(w.get("source")), "hub_bytes": _count(w.get("hub_bytes")),
            "peer_bytes": _count(w.get("peer_bytes")),
        }
    e = raw.get("engine")
    if isinstance(e, dict):
        out["engine"] = {"state": printable(e.get("state", "unknown"), 40), "restarting": e.get("restarting") is True,
                         "restart_count": _count(e.get("restart_count")) or 0,
                         "started_at": _opt_text(e.get("started_at")),
                         "exit_code": e.get("exit_code") if isinstance(e.get("exit_code"), int) else None}
    return out


def vm_states(api: HyperstackClient | None, nodes: list[NodeRecord]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for node in nodes:
        if api is None:
            out[node.name] = {"status": "unknown (no API key)", "created_at": None}
            continue
        try:
            vm = api.get_vm(int(node.vm_id))
            out[node.name] = {"status": vm.get("status"), "created_at": vm.get("created_at"),
                              "floating_ip": vm.get("floating_ip")}
        except (HyperstackError, ValueError) as err:
            out[node.name] = {"status": "gone (404)" if getattr(err, "not_found", False) else f"unknown ({err})",
                              "created_at": None}
    return out


def probe_node(runner: NodeRunner, node: NodeRecord, settings: Settings) -> dict[str, Any]:
    if node.connection is None:
        return {"error": "no node command in the state reaches this VM yet"}
    command = probe_command(settings.node_root, settings.storage_path,
                            "models--" + settings.model.replace("/", "--"), settings.model_spec.checkpoint_bytes)
    code, out, err = runner.run(node.connection, command, PROBE.read_text(), PROBE_TIMEOUT_S)
    if code != 0:
        return {"error": f"probe exited {code}: {printable((err or out).strip()[-200:])}"}
    try:
        import json

        return checked_probe(json.loads(out.strip().splitlines()[-1]))
    except (ValueError, IndexError, RecursionError):
        return {"error": f"probe printed no JSON: {printable(out.strip()[-200:])}"}


def weights_view(probe: Mapping[str, Any], previous: Sample | None, now: float) -> dict[str, Any] | None:
    w = probe.get("weights")
    if not w:
        return None
    done, total = int(w.get("bytes_done") or 0), w.get("bytes_total")
    steps = {s.get("step"): s for s in probe.get("steps") or []}
    started = (steps.get("weights") or {}).get("started_at")
    checked = "check" in steps and not steps["check"].get("running") and "launch" in steps
    if checked and w.get("source") != "progress file":
        total = done  # the check step compared every file with the hub's manifest before the launch ran
    updated = _parse_time(w.get("updated_at"))
    rate = None
    if previous is not None and now > previous.at and done >= previous.bytes_done:
        rate = (done - previous.bytes_done) / (now - previous.at)
    elif started and updated and updated > started:
        rate = done / (updated - started)  # the average since the weights step started
    percent = round(100.0 * done / total, 1) if total else None
    eta = (total - done) / rate if rate and total and total > done else (0.0 if total and done >= total else None)
    return {"bytes_done": done, "bytes_total": total, "percent": percent, "files_done": w.get("files_done"),
            "files_total": w.get("files_total"), "rate_bytes_s": rate, "eta_s": eta,
            "seconds_since_progress": (now - updated) if updated else None, "source": w.get("source"),
            "hub_bytes": w.get("hub_bytes"), "peer_bytes": w.get("peer_bytes")}


def step_in_progress(probe: Mapping[str, Any]) -> str:
    steps = probe.get("steps") or []
    running = [s["step"] for s in steps if s.get("running")]
    if running:
        return ", ".join(running)
    if not steps:
        return "none yet"
    last = max(steps, key=lambda s: s.get("started_at") or 0)["step"]
    engine_state = (probe.get("engine") or {}).get("state")
    if last in ("launch", "readiness", "cache-save") and engine_state in ("running", "restarting"):
        return "done"
    # replicas >= 2: a replica head ends with its engine-ready wait; the front runs no engine, only the proxy.
    if last == "engine-ready" and engine_state in ("running", "restarting"):
        return "done"
    if last == "readiness" and (probe.get("proxy") or {}).get("state") == "running":
        return "done"
    return f"idle after {last} (failed or interrupted: pulumi up runs it again)"


def endpoint_view(base_url: str | None, api_key: str | None, model: str, ca_pem: str | None = None) -> dict[str, Any]:
    if not base_url:
        return {"url": None, "health": "no address yet"}
    if ca_pem and base_url.startswith("https://"):
        # The stack's own CA (output ca_certificate) is the only one trusted for its endpoint.
        with tempfile.NamedTemporaryFile("w", suffix=".pem", delete=False) as fh:
            fh.write(ca_pem)
        try:
            return _endpoint_view(base_url, api_key, model, fh.name)
        finally:
            os.unlink(fh.name)
    return _endpoint_view(base_url, api_key, model, True)


def _endpoint_view(base_url: str, api_key: str | None, model: str, verify: str | bool) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    view: dict[str, Any] = {"url": base_url}
    session = requests.Session()
    session.trust_env = False  # the endpoint is reached directly, as the readiness wait reaches it
    session.verify = verify
    try:
        health = session.get(f"{base_url}/health", headers=headers, timeout=HTTP_TIMEOUT_S)
        view["health"] = "ok" if health.ok else f"HTTP {health.status_code}"
    except requests.RequestException as exc:
        view["health"] = f"unreachable ({type(exc).__name__})"
        return view
    try:
        models = session.get(f"{base_url}/v1/models", headers=headers, timeout=HTTP_TIMEOUT_S)
        listed = models.json() if models.ok else {}
        data = listed.get("data") if isinstance(listed, dict) else None
        ids = [m.get("id") for m in data if isinstance(m, dict)] if isinstance(data, list) else []
        view["models"] = [printable(i, 120) for i in ids[:20]]
        view["serves_model"] = model in ids
    except (requests.RequestException, ValueError):
        view["serves_model"] = False
    try:
        metrics = session.get(f"{base_url}/metrics", headers=headers, timeout=HTTP_TIMEOUT_S)
        if metrics.ok:
            view.update(parse_metrics(metrics.text))
    except requests.RequestException:
        pass
    return view


def advice(nodes: list[dict[str, Any]], endpoint: Mapping[str, Any], per_node_usd: float | None = None) -> str | None:
    """One line: the first thing stuck, and what to do about it."""
    for node in nodes:
        status = str(node.get("vm", {}).get("status"))
        if status in ("SHUTOFF", "STOPPING"):
            cost = f"${per_node_usd:,.2f}/h" if per_node_usd is not None else "its hourly price"
            return (f"{node['name']}: the VM is {status} (stopped behind Pulumi's back): it serves nothing and STILL "
                    f"BILLS {cost}; `pulumi up` replaces it (a new VM, its whole chain and rules)")
    for node in nodes:
        engine = (node.get("probe") or {}).get("engine") or {}
        if engine.get("restart_count", 0) >= CRASH_LOOP_RESTARTS or engine.get("restarting"):
            return (f"{node['name']}: the engine is restarting in a loop ({engine.get('restart_count', 0)} restarts); "
                    "read `sudo docker logs --tail 100 kimi-engine` on it, fix the cause, then `pulumi up` "
                    "re-runs the launch")
    for node in nodes:
        w = node.get("weights") or {}
        idle = w.get("seconds_since_progress")
        if w and w.get("bytes_total") and w["bytes_done"] < w["bytes_total"] and idle and idle >= STALL_SECONDS:
            return (f"{node['name']}: no download progress for {idle / 60:.0f} min; read "
                    "`tail /var/log/kimi-cluster/weights.log` and `systemctl status kimi-weights` on it; "
                    "`pulumi up` re-attaches to the download or restarts it, keeping every finished file")
    for node in nodes:
        if str(node.get("vm", {}).get("status")) == "ERROR":
            return f"{node['name']}: the VM is in ERROR; `pulumi up` deletes and recreates it"
    return None


# How long the main thread waits on a probe at a time. The kernel may hand SIGTERM or SIGHUP to a worker thread, and
# Python runs the handler (which removes the key files and exits) only once the main thread runs bytecode again: a
# wait without a timeout held it off until every probe had ended, up to the probe's own timeout.
RESULT_SLICE_S = 0.2


def _result(future: Future[dict[str, Any]]) -> dict[str, Any]:
    while True:
        try:
            return future.result(timeout=RESULT_SLICE_S)
        except TimeoutError:
            continue


def gather(state: StackState, settings: Settings, runner: NodeRunner, api: HyperstackClient | None,
           previous: Mapping[str, Sample] | None = None) -> dict[str, Any]:
    now = time.time()
    vms = vm_states(api, state.nodes)
    with ThreadPoolExecutor(max_workers=max(len(state.nodes), 1)) as pool:
        probes = [_result(pool.submit(probe_node, runner, n, settings)) for n in state.nodes]
    hourly, price_source = state.outputs.get("hourly_cost_usd"), state.outputs.get("hourly_cost_source")
    if hourly is None:  # outputs are registered at the end of an up: meanwhile, the catalog's figure
        fallback = catalog_quote(settings)
        hourly = fallback.usd_per_hour
        price_source = f"{fallback.summary()} (the stack has no hourly_cost_usd output yet)"
    per_node = hourly / max(len(state.nodes), 1) if isinstance(hourly, (int, float)) else None
    nodes: list[dict[str, Any]] = []
    cost, oldest = 0.0, None
    for node, probe in zip(state.nodes, probes, strict=False):
        vm = vms.get(node.name, {})
        created = _parse_time(vm.get("created_at"))
        uptime = now - created if created else None
        if uptime is not None:
            oldest = max(oldest or 0.0, uptime)
            if per_node is not None:
                cost += per_node * uptime / 3600
        nodes.append({
            "rank": node.rank, "name": node.name, "vm_id": node.vm_id, "public_ip": node.public_ip,
            "vm": vm, "uptime_s": uptime, "step": step_in_progress(probe) if "error" not in probe else "unknown",
            "weights": weights_view(probe, (previous or {}).get(node.name), now) if "error" not in probe else None,
            "weights_unit": probe.get("weights_unit"), "weights_log": probe.get("weights_log"),
            "engine": probe.get("engine"), "probe_error": probe.get("error"), "probe": probe,
        })
    head = state.nodes[0].public_ip if state.nodes else None
    host = settings.api_hostname or head
    base = state.endpoint_url or (f"https://{host}:{settings.api_port}" if host else None)
    endpoint = endpoint_view(base, state.outputs.get("api_key"), settings.served_name,
                             state.outputs.get("ca_certificate"))
    endpoint["ready_output"] = bool(state.endpoint_url)
    cost_so_far = round(cost, 2) if per_node is not None and oldest else None
    report = {
        "stack": state.stack, "at": now, "topology": state.outputs.get("topology") or settings.topology,
        "region": state.outputs.get("region"), "nodes": nodes, "endpoint": endpoint,
        "hourly_cost_usd": hourly, "hourly_cost_source": price_source,
        "uptime_s": oldest, "cost_so_far_usd": cost_so_far,
    }
    # The engine's counters start at zero with each engine start, the spend with the VMs: after a restart of the
    # engine the cost per token counts the earlier hours against fewer tokens, never the other way round.
    report["token_cost"] = token_cost(cost_so_far, endpoint.get("prompt_tokens"),
                                      endpoint.get("generation_tokens"), settings.api_price).to_json()
    report["advice"] = advice(nodes, endpoint, per_node)
    report["release"] = release_view(state.outputs)

    if (replicas := replicas_view(state, nodes, runner, settings.engine_port)) is not None:
        report["replicas"] = replicas
    if (care := caretaker_view(state, settings, runner)) is not None:
        report["caretaker"] = care
    for view in nodes:
        view.pop("probe")
    return report


def samples(report: Mapping[str, Any]) -> dict[str, Sample]:
    """This report's byte counts, for the next refresh's rate."""
    out = {}
    for node in report.get("nodes") or []:
        w = node.get("weights")
        if w:
            out[node["name"]] = Sample(at=report["at"], bytes_done=w["bytes_done"])
    return out
