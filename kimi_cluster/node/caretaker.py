#!/usr/bin/env python3
"""The caretaker: stops paying for a cluster nobody uses. Runs where the endpoint is, as systemd unit kimi-caretaker.

Every `poll_seconds` it
- counts the inference requests (POSTs) in the proxy's access log (Caddy's JSON lines: method, path and status; the
  proxy drops the headers and never logs a body, so no prompt and no key is ever read); GETs (`/health`,
  `/v1/models`, `/metrics`) and 401s do not count;
- asks the proxy's own `/health` whether the endpoint serves: the idle clock starts at the first healthy answer after
  each `pulumi up` (a bring-up of half an hour is not idleness);
- reads what the stack's GPU VMs have cost from Hyperstack's billing history (caretaker_spend.py, shipped beside it),
  with its own API key; while that fails it counts on from the last figure at the stack's full rate;
- at 80 % of `budget_usd` writes the warning /health carries; at 100 %, or after `idle_seconds` without a request,
  deletes the stack's GPU VMs through the API: replicas first, the head last, itself last of all. Before the first
  delete it writes the 503 answer the proxy gives from then on. The environment, keypair, rules and front stay.

Everything it knows (the idle clock, the count, the spend, what it did and when) is in its state file on its own
disk, written atomically after every poll: killed and restarted (systemd's Restart=always), it carries on where it
was, and a stop it began is finished. On the front, which stays, it takes the 503 away once an `up` has made the GPU
VMs again (so that up's readiness wait gets through); `--arm` (the caretaker step, run by each `up` once the endpoint
is ready) clears a finished stop and starts the idle clock afresh. It reaches nothing but the Hyperstack API and the
proxy on loopback.
"""

from __future__ import annotations

import argparse
import json
import os
import ssl
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

# kimi_cluster/node/caretaker_api.py and caretaker_spend.py are shipped beside this file (as on the deploying side's
# checkout).
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kimi_cluster.node.caretaker_api import Api, ApiError, log

WARN_FRACTION = 0.8
STOPPED_FILE = "stopped.json"  # the proxy answers 503 with this body while it exists
WARNING_FILE = "budget-warning.json"  # /health answers this body (when the engine is healthy) while it exists
LOG_READ_MAX = 64 * 1024 * 1024  # bytes of access log read per poll; the rest next time
HISTORY_KEEP = 10

__all__ = ["Api", "ApiError", "log"]


def stamp(t: float | None) -> str | None:
    return None if t is None else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


# ---- state on its own disk ----------------------------------------------------------------------------------------

def load_state(path: Path) -> dict[str, Any]:
    try:
        state = json.loads(path.read_text())
        if isinstance(state, dict):
            return state
    except (OSError, ValueError):
        pass
    now = time.time()
    return {"armed_at": now, "last_request_at": now, "served_since": None, "requests": 0, "log": {},
            "spend_usd": 0.0, "spend_at": None, "spend_source": "none yet", "action": None, "history": []}


def write_json(path: Path, data: Any) -> None:
    """Atomically: a reader (the proxy, `status`, the next start) sees the old file or the new one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)


def arm(cfg: dict[str, Any]) -> None:
    """A new `up`: a finished stop goes to the history, the 503 goes, and the idle clock starts again."""
    path = Path(cfg["state_file"])
    path.parent.mkdir(parents=True, exist_ok=True)
    state = load_state(path)
    action = state.get("action")
    if action:
        state["history"] = (state.get("history") or [])[-(HISTORY_KEEP - 1):] + [action]
        state["action"] = None
    now = time.time()
    state.update(armed_at=now, last_request_at=now, served_since=None, awaiting_arm=False)
    (Path(cfg["flag_dir"]) / STOPPED_FILE).unlink(missing_ok=True)
    write_json(path, state)
    log(f"armed: idle clock restarted{'; the earlier stop (' + action['reason'] + ') is history' if action else ''}")


# ---- what it watches ------------------------------------------------------------------------------------------------

def _counted(lines: bytes) -> int:
    count = 0
    for line in lines.splitlines():
        try:
            entry = json.loads(line)
            method = str(entry["request"]["method"])
            status = int(entry.get("status") or 0)
        except (ValueError, KeyError, TypeError):
            continue
        if method == "POST" and status not in (401, 503):
            count += 1
    return count


def _rolled(access_log: Path, inode: int) -> Path | None:
    """The file Caddy rolled the log into, found by its inode: `roll_uncompressed` keeps it beside the log as it was,
    named access-<time>.log (Caddy's file output, lumberjack's naming)."""
    for path in access_log.parent.glob(f"{access_log.stem}-*{access_log.suffix}"):
        try:
            if path.stat().st_ino == inode:
                return path
        except OSError:
            continue
    return None


def new_requests(access_log: Path, mark: dict[str, Any]) -> int:
    """Requests logged since the last look that count: the inference calls, which are POSTs (chat, completions,
    messages, embeddings), not refused for want of the key (401) nor by a stopped cluster (503). GETs do not count:
    /health (load balancers), /v1/models and /metrics (`status`, monitors, the readiness wait) would otherwise keep an
    unused cluster alive. The proxy logs only requests with the stack's key
    (kimi_cluster/plan/templates/_caretaker.Caddyfile.j2), so no stranger fills or rolls the log; and when it rolls,
    the rest of the old file is read before the new one."""
    try:
        current = open(access_log, "rb")  # opened first: a roll after this leaves this file the one read and marked
    except FileNotFoundError:
        return 0
    with current:
        st = os.fstat(current.fileno())
        count, offset = 0, int(mark.get("offset") or 0)
        if mark.get("inode") not in (None, st.st_ino):
            rolled = _rolled(access_log, int(mark["inode"]))
            if rolled is None:
                log(f"the access log rolled and its old file is gone; what it held after byte {offset} is not counted")
            else:
                with open(rolled, "rb") as fh:  # finished: Caddy writes no more to it, its last line counts too
                    fh.seek(offset)
                    count += _counted(fh.read(LOG_READ_MAX))
            offset = 0
        elif st.st_size < offset:
            offset = 0  # truncated in place
        current.seek(offset)
        chunk = current.read(LOG_READ_MAX)
    complete = chunk[:chunk.rfind(b"\n") + 1]  # a line still being written is read next time
    mark.update(inode=st.st_ino, offset=offset + len(complete))
    return count + _counted(complete)


def serving(cfg: dict[str, Any]) -> bool:
    """Whether the proxy's /health answers 200 on loopback (TLS checked against the stack's CA, not the name)."""
    context = ssl.create_default_context(cafile=cfg["ca_file"]) if os.path.exists(cfg["ca_file"]) else None
    if context is not None:
        context.check_hostname = False  # the certificate names the public address; this dials loopback
    try:
        with urllib.request.urlopen(cfg["health_url"], timeout=5, context=context) as answer:
            return bool(answer.status == 200)
    except (OSError, ValueError):
        return False


# ---- one poll ------------------------------------------------------------------------------------------------------

def spend(cfg: dict[str, Any], api: Api, state: dict[str, Any], now: float) -> None:
    from kimi_cluster.node.caretaker_spend import spent_usd

    names = cfg["gpu_vms"]
    try:
        usd = spent_usd(lambda path, query: api.call("GET", path, dict(query)), cfg["env_name"], names)
        state.update(spend_usd=max(usd, 0.0), spend_at=now, spend_source="billing history")
    except Exception as err:  # noqa: BLE001  # any failure of the read (an answer of any shape) is what this covers
        # Never less than the truth: the last figure, plus the whole stack's rate since it was read.
        since = now - (state.get("spend_at") or now)
        state["spend_usd"] = float(state.get("spend_usd") or 0.0) + cfg["usd_per_hour"] * since / 3600
        state.update(spend_at=now, spend_source=f"estimated (billing history: {str(err)[:200]})")


def warn_budget(cfg: dict[str, Any], state: dict[str, Any]) -> None:
    flag = Path(cfg["flag_dir"]) / WARNING_FILE
    budget = cfg.get("budget_usd")
    if budget and state["spend_usd"] >= WARN_FRACTION * budget and not state.get("action"):
        text = (f"budget {100 * state['spend_usd'] / budget:.0f}% spent (${state['spend_usd']:,.2f} of "
                f"${budget:,.2f}); the caretaker deletes the GPU VMs at 100%")
        write_json(flag, {"status": "ok", "warning": text})
        state["warning"] = text
    else:
        flag.unlink(missing_ok=True)
        state.pop("warning", None)


def idle_reason(cfg: dict[str, Any], state: dict[str, Any], now: float) -> tuple[str, str] | None:
    """The idle stop, decided from the log and the clock alone: no API answer can keep it from being decided."""
    idle = cfg.get("idle_seconds")
    if not idle or state.get("awaiting_arm") or not state.get("served_since"):
        return None  # awaiting_arm: an `up` is bringing the cluster back, the idle clock waits for its caretaker step
    quiet = now - max(state["last_request_at"], state["served_since"])
    if quiet < idle:
        return None
    return "idle", (f"no request for {quiet / cfg['minute_seconds']:.0f} minutes (kimi-cluster:idleStopMinutes "
                    f"{idle / cfg['minute_seconds']:.0f})")


def budget_reason(cfg: dict[str, Any], state: dict[str, Any]) -> tuple[str, str] | None:
    budget = cfg.get("budget_usd")
    if budget and state["spend_usd"] >= budget:
        return "budget", (f"the budget is spent: ${state['spend_usd']:,.2f} of ${budget:,.2f} "
                          "(kimi-cluster:budgetUsd)")
    return None


def begin_stop(cfg: dict[str, Any], state: dict[str, Any], reason: str, why: str, now: float) -> None:
    word = "idle" if reason == "idle" else "over its budget"
    body = {"error": {"message": f"this cluster was stopped for being {word}: {why}; its GPU VMs are deleted, and "
                                 "`pulumi up` brings it back", "type": "cluster_stopped", "code": 503,
                      "reason": reason, "stopped_at": stamp(now)}}
    write_json(Path(cfg["flag_dir"]) / STOPPED_FILE, body)
    state["action"] = {"reason": reason, "why": why, "started_at": stamp(now), "started": now, "deleted": [],
                       "done_at": None, "spend_usd_at_stop": round(state["spend_usd"], 4), "errors": []}
    state.pop("warning", None)
    (Path(cfg["flag_dir"]) / WARNING_FILE).unlink(missing_ok=True)
    log(f"STOPPING: {why}; deleting the GPU VMs {', '.join(cfg['gpu_vms'][::-1])} (the 503 is up)")


def carry_on_stop(cfg: dict[str, Any], api: Api, state: dict[str, Any], save: Any) -> None:
    """Delete every GPU VM still there, in order, saving after each; itself (the head) last. A failure is retried
    at the next poll."""
    action = state["action"]
    try:
        ids = api.vm_ids(cfg["env_name"])
    except (ApiError, OSError) as err:
        action["errors"] = (action["errors"] + [f"listing the VMs: {err}"])[-5:]
        log(f"cannot list the VMs yet ({err}); retrying at the next poll")
        return
    order = [n for n in reversed(cfg["gpu_vms"]) if n != cfg.get("self_name")]
    if cfg.get("self_name") in cfg["gpu_vms"]:
        order.append(cfg["self_name"])
    pending = False
    for name in order:
        if name not in ids or name in action["deleted"]:
            continue
        if name == cfg.get("self_name"):
            # Done is recorded first: the delete ends this machine, and nothing else is left to do.
            action["deleted"].append(name)
            action["done_at"] = stamp(time.time())
            save()
            log(f"deleting {name} (id {ids[name]}), the VM this caretaker runs on, last of all")
        try:
            api.call("DELETE", f"/core/virtual-machines/{ids[name]}")
        except ApiError as err:
            if err.status != 404:
                pending = True
                action["errors"] = (action["errors"] + [f"deleting {name}: {err}"])[-5:]
                log(f"could not delete {name} yet ({err}); retrying at the next poll")
                continue
        except OSError as err:
            pending = True
            log(f"could not delete {name} yet ({err}); retrying at the next poll")
            continue
        if name not in action["deleted"]:
            action["deleted"].append(name)
        log(f"deleted {name} (id {ids[name]})")
        save()
    if not pending and not action.get("done_at"):
        action["done_at"] = stamp(time.time())
        log(f"stopped: every GPU VM is deleted ({action['why']}); `pulumi up` brings the cluster back")


def back_again(cfg: dict[str, Any], api: Api, state: dict[str, Any]) -> None:
    """After a finished stop (on the front, which stays): once an `up` has made every GPU VM again, the 503 goes, so
    that the up's readiness wait gets through; the idle clock waits for the caretaker step, which that up runs once
    the endpoint is ready (arm)."""
    try:
        ids = api.vm_ids(cfg["env_name"])
    except (ApiError, OSError):
        return
    if all(name in ids for name in cfg["gpu_vms"]):
        action = state["action"]
        state["history"] = (state.get("history") or [])[-(HISTORY_KEEP - 1):] + [action]
        state.update(action=None, awaiting_arm=True, served_since=None)
        (Path(cfg["flag_dir"]) / STOPPED_FILE).unlink(missing_ok=True)
        log(f"the GPU VMs are back (an up re-created them): the 503 of the {action['reason']} stop is gone")


def tick(cfg: dict[str, Any], api: Api, state: dict[str, Any], save: Any) -> None:
    now = time.time()
    counted = new_requests(Path(cfg["flag_dir"]) / "access.log", state.setdefault("log", {}))
    if counted:
        state["requests"] = int(state.get("requests") or 0) + counted
        state["last_request_at"] = now
    action = state.get("action")
    if not action and not state.get("awaiting_arm") and not state.get("served_since") and serving(cfg):
        state["served_since"] = now
        log("the endpoint serves: the idle clock runs from now")
    # The idle stop first, from what is on this disk; then the spend, whose read may fail in any way (it then
    # counts on at the full rate) but can no longer keep the idle stop from being decided.
    stop = None if action else idle_reason(cfg, state, now)
    if stop:
        begin_stop(cfg, state, *stop, now)
        save()
    spend(cfg, api, state, now)
    if not state.get("action"):
        warn_budget(cfg, state)
        stop = budget_reason(cfg, state)
        if stop:
            begin_stop(cfg, state, *stop, now)
            save()
    if state.get("action") and not state["action"].get("done_at"):
        carry_on_stop(cfg, api, state, save)
    elif state.get("action"):
        back_again(cfg, api, state)
    served = state.get("served_since")
    state["idle_minutes"] = round((now - max(state["last_request_at"], served)) / cfg["minute_seconds"], 2) \
        if served else 0.0
    state["updated_at"] = now
    save()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help="the caretaker's configuration (JSON, no secret)")
    parser.add_argument("--arm", action="store_true", help="a new up: clear a finished stop, restart the idle clock")
    parser.add_argument("--once", action="store_true", help="one poll, then exit (tests)")
    args = parser.parse_args(argv)
    cfg = json.loads(Path(args.config).read_text())
    if args.arm:
        arm(cfg)
        return 0
    key = Path(cfg["key_file"]).read_text().strip()
    if not key:
        log(f"no API key in {cfg['key_file']}; the caretaker step writes it from its stdin")
        return 1
    api = Api(cfg["api_url"], key, float(cfg.get("retry_base_seconds", 1.0)))
    path = Path(cfg["state_file"])
    state = load_state(path)
    idle = f"after {cfg['idle_seconds'] / cfg['minute_seconds']:g} min" if cfg.get("idle_seconds") else "off"
    budget = f"${cfg['budget_usd']:,.2f}" if cfg.get("budget_usd") else "off"
    log(f"caretaker for {cfg['env_name']}: idle stop {idle}, budget {budget}; {int(state.get('requests') or 0)} "
        f"requests counted so far, spend ${float(state.get('spend_usd') or 0):,.2f}")
    while True:
        tick(cfg, api, state, lambda: write_json(path, state))
        if args.once:
            return 0
        time.sleep(cfg["poll_seconds"])


if __name__ == "__main__":
    sys.exit(main())
