"""Status of replicas behind a front (replicas >= 2): each replica's nodes and health, and the front's own view.

The front's view is taken on the front itself, over the path Caddy uses: one command there asks every replica's
engine for /health and /metrics on its private address and enginePort (the firewall admits only the front there).
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from kimi_cluster.node.printable import printable
from kimi_cluster.operator.engine_metrics import parse_metrics
from kimi_cluster.operator.node_exec import NodeRunner
from kimi_cluster.operator.stack_state import Connection, StackState

PROBE_TIMEOUT_S = 30
# Runs on the front (python3 is on every Ubuntu image): prints one JSON line, one entry per upstream.
_FRONT_PROBE = r"""
import json, sys, urllib.request
out = []
for upstream in sys.argv[1:]:
    entry = {"upstream": upstream}
    for path in ("/health", "/metrics"):
        try:
            with urllib.request.urlopen(f"http://{upstream}{path}", timeout=3) as answer:
                body = answer.read(200000).decode(errors="replace") if path == "/metrics" else ""
                entry[path] = [answer.status, body]
        except Exception as exc:  # any failure is what the front sees of this upstream
            entry[path] = [None, f"{type(exc).__name__}: {exc}"[:200]]
    out.append(entry)
print(json.dumps(out))
"""


def front_view(runner: NodeRunner, front: Connection, upstreams: Sequence[str]) -> list[dict[str, Any]]:
    """Per upstream: whether it answers /health to the front, and its request and token counters."""
    command = "python3 - " + " ".join(shlex.quote(u) for u in upstreams)
    code, out, err = runner.run(front, command, _FRONT_PROBE, PROBE_TIMEOUT_S)
    if code != 0:
        return [{"upstream": u, "health": f"unknown (probe on the front exited {code}: {(err or out)[-120:]})"}
                for u in upstreams]
    try:
        raw = json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError, RecursionError):
        raw = None
    # What the front printed is whatever runs there: read field by field, a wrong shape is no answer.
    if not isinstance(raw, list) or len(raw) != len(upstreams) or not all(isinstance(e, dict) for e in raw):
        return [{"upstream": u, "health": "unknown (the front's probe printed no JSON of its shape)"}
                for u in upstreams]
    view = []
    for upstream, entry in zip(upstreams, raw, strict=True):
        status, detail = _answer(entry.get("/health"))
        row: dict[str, Any] = {"upstream": upstream,
                               "health": "ok" if status == 200 else f"down ({status or printable(detail, 200)})"}
        m_status, metrics = _answer(entry.get("/metrics"))
        if m_status == 200:
            row.update(parse_metrics(metrics))
        view.append(row)
    return view


def _answer(pair: Any) -> tuple[int | None, str]:
    """The probe's [status, body] of one path (None and "" for anything else)."""
    if isinstance(pair, list) and len(pair) == 2 and isinstance(pair[1], str) \
            and (pair[0] is None or type(pair[0]) is int):
        return pair[0], pair[1]
    return None, ""


def replicas_view(state: StackState, nodes: Sequence[Mapping[str, Any]], runner: NodeRunner,
                  engine_port: int) -> dict[str, Any] | None:
    """Each replica's nodes with their engine state, and the front's view of every replica (None: one replica)."""
    out = state.outputs
    groups = out.get("replica_node_names")
    if not groups or not out.get("front_public_ip"):
        return None
    by_name = {n["name"]: n for n in nodes}
    heads = list(out.get("replica_head_private_ips") or [])
    upstreams = [f"{ip}:{engine_port}" for ip in heads]
    front_node = next((n for n in state.nodes if n.public_ip == out["front_public_ip"]), None)
    seen = (front_view(runner, front_node.connection, upstreams) if front_node and front_node.connection
            else [{"upstream": u, "health": "unknown (no node command reaches the front yet)"} for u in upstreams])
    replicas = []
    for index, names in enumerate(groups):
        members = [by_name.get(name, {"name": name}) for name in names]
        replicas.append({"replica": index, "nodes": [m.get("name") for m in members],
                         "vms": [str((m.get("vm") or {}).get("status")) for m in members],
                         "engine": (members[0].get("engine") or {}).get("state") if members else None,
                         "front_view": seen[index] if index < len(seen) else None})
    return {"front": out["front_public_ip"], "replicas": replicas}


def format_replicas(view: Mapping[str, Any]) -> list[str]:
    lines = [f"front {view['front']}: its view of each replica (/health and /metrics from the front)"]
    for r in view["replicas"]:
        seen = r.get("front_view") or {}
        traffic = ", ".join(f"{seen[k]:,} {label}" for k, label in (
            ("requests", "requests"), ("prompt_tokens", "prompt tokens"), ("generation_tokens", "generated tokens"))
            if k in seen)
        lines.append(f"  replica {r['replica']}: {', '.join(str(n) for n in r['nodes'])}  VM {'/'.join(r['vms'])}  "
                     f"engine {r.get('engine') or '?'}  front sees {seen.get('upstream', '?')}: "
                     f"{seen.get('health', '?')}{'; ' + traffic if traffic else ''}")
    return lines
