"""The fake node's `systemctl` and `systemd-run`: transient units, each run by a monitor process that plays
systemd for it (restarts included) and records how it ended (see _fakenode.py)."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

from _fakestate import (
    DEFAULT_DOCKER_ROOT,
    DOCKER,
    DOCKER_DEFAULT,
    ROOT,
    UNITS,
    alive,
    docker_state,
    fail,
    kill_group,
    locked_json,
    write_json_atomic,
)

# subprocess is imported where it is used, as _fakenode.py says.

def unit_file(unit: str) -> Path:
    return UNITS / f"{unit.removesuffix('.service')}.json"


def unit_props(unit: str) -> dict:
    if unit in ("docker", "docker.service", "docker.socket"):
        running = docker_state()["running"]
        return {"ActiveState": "active" if running else "inactive", "Result": "success", "ExecMainStatus": "0",
                "LoadState": "loaded", "SubState": "running" if running else "dead"}
    p = unit_file(unit)
    if not p.exists():
        return {"ActiveState": "inactive", "Result": "success", "ExecMainStatus": "0", "LoadState": "not-found",
                "SubState": "dead"}
    u = json.loads(p.read_text())
    if u["state"] in ("active", "activating", "deactivating") and u.get("pid") and not alive(u["pid"]) \
            and u.get("monitor") and not alive(u["monitor"]):
        u.update(state="failed", result="signal", status=9)  # the monitor itself was killed
    return {"ActiveState": u["state"], "Result": u.get("result") or "success",
            "ExecMainStatus": str(u.get("status") or 0), "LoadState": "loaded",
            "SubState": "running" if u["state"] == "active" else "dead", "MainPID": str(u.get("pid") or 0)}


def systemctl(argv: list[str]) -> None:
    args = [a for a in argv if a not in ("--quiet", "-q", "--no-pager", "--no-block")]
    if not args:
        fail("fake systemctl: no command")
    cmd, rest = args[0], args[1:]
    if cmd in ("start", "stop", "restart") and all(u in ("docker", "docker.service", "docker.socket") for u in rest):
        with locked_json(DOCKER / "state.json", DOCKER_DEFAULT) as st:
            if cmd == "stop":
                st["running"] = False
            else:
                cfg = ROOT / "etc/docker/daemon.json"
                st["root"] = json.loads(cfg.read_text()).get("data-root", DEFAULT_DOCKER_ROOT) if cfg.exists() \
                    else DEFAULT_DOCKER_ROOT
                st["running"] = True
        return
    if cmd == "is-active":
        state = unit_props(rest[-1])["ActiveState"]
        print(state)
        sys.exit(0 if state == "active" else 3)
    if cmd == "show":
        props, value_only, unit = None, False, None
        i = 0
        while i < len(rest):
            a = rest[i]
            if a in ("-p", "--property"):
                props = rest[i + 1].split(",")
                i += 1
            elif a.startswith("--property="):
                props = a.split("=", 1)[1].split(",")
            elif a == "--value":
                value_only = True
            else:
                unit = a
            i += 1
        values = unit_props(unit or "")
        for p in props or sorted(values):
            print(values.get(p, "") if value_only else f"{p}={values.get(p, '')}")
        return
    if cmd == "stop":
        for unit in rest:
            _stop_unit(unit, wait="--no-block" not in argv)
        return
    if cmd == "reset-failed":
        for unit in rest:
            path = unit_file(unit)
            if path.exists() and json.loads(path.read_text())["state"] == "failed":
                path.unlink()
        return
    if cmd == "status":
        for unit in rest:
            print(f"{unit}: {unit_props(unit)}")
        return
    if cmd == "daemon-reload":
        return
    fail(f"fake systemctl: unsupported {argv!r}", 2)


def _stop_unit(unit: str, wait: bool) -> None:
    """SIGTERM to the unit's process; without --no-block, wait (as systemctl does) until it has ended."""
    p = unit_file(unit)
    if not p.exists():
        return
    u = json.loads(p.read_text())
    if u["state"] not in ("active", "activating"):
        return
    u["state"] = "deactivating"
    u["stopped_at"] = time.time()  # the monitor kills it TimeoutStopSec after this
    write_json_atomic(p, u)
    kill_group(u["pid"])
    if not wait:
        return
    deadline = time.time() + 10
    while p.exists() and time.time() < deadline:
        time.sleep(0.05)


def systemd_run(argv: list[str]) -> None:
    unit, props, setenv = None, {}, {}
    i = 0
    while i < len(argv):
        a = argv[i]
        if not a.startswith("-"):
            break
        key, has_eq, inline = a.partition("=")
        if key in ("--unit", "-u", "--description", "--property", "-p", "--setenv", "-E"):
            value = inline if has_eq else argv[i + 1]
            i += 0 if has_eq else 1
            if key in ("--unit", "-u"):
                unit = value
            elif key in ("--property", "-p"):
                k, _, v = value.partition("=")
                props[k] = v
            elif key in ("--setenv", "-E"):
                k, _, v = value.partition("=")
                setenv[k] = v
        elif key in ("--wait", "--pty", "--scope", "--user"):
            fail(f"fake systemd-run: {key} is not emulated", 2)
        i += 1
    command = argv[i:]
    if not unit or not command:
        fail("fake systemd-run: needs --unit and a command", 2)
    p = unit_file(unit)
    if p.exists():
        fail(f"Failed to start transient service unit: Unit {unit}.service was already loaded or has a fragment file.")
    UNITS.mkdir(parents=True, exist_ok=True)
    write_json_atomic(p, {"unit": unit, "state": "activating", "pid": None, "command": command})
    spec = {"unit": unit, "props": props, "setenv": setenv, "command": command}
    import subprocess

    subprocess.Popen([sys.executable, __file__, "--monitor", json.dumps(spec)], start_new_session=True,
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                     env=dict(os.environ))
    deadline = time.time() + 10
    while time.time() < deadline:
        if p.exists() and json.loads(p.read_text()).get("pid"):
            print(f"Running as unit: {unit}.service", file=sys.stderr)
            return
        if not p.exists():
            return
        time.sleep(0.02)
    fail("fake systemd-run: the unit did not start")


def monitor(spec_json: str) -> None:
    """Plays systemd for one transient unit: runs it in its own session and records how it ended."""
    spec = json.loads(spec_json)
    p = unit_file(spec["unit"])
    out_spec = spec["props"].get("StandardOutput", "")
    log_path = (out_spec.split(":", 1)[1] if out_spec.startswith(("append:", "file:"))
                else str(UNITS / f"{spec['unit']}.log"))
    # systemd starts units with a clean environment; PATH, the fake's knobs and the machine's trust store (the
    # sandbox hub's CA, as systemd's DefaultEnvironment would carry it) stand in for the node's defaults.
    env = {k: v for k, v in os.environ.items() if k == "PATH" or k.startswith("FAKE_")
           or k in ("LANG", "TMPDIR", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE")}
    env.update(spec["setenv"])
    Path(log_path).parent.mkdir(parents=True, exist_ok=True)
    import subprocess

    # Restart=always (the caretaker's unit): a child that ends, killed or not, is started again after RestartSec,
    # unless `systemctl stop` ended it (the unit is then "deactivating").
    always = spec["props"].get("Restart") == "always"
    restart_s = float(spec["props"].get("RestartSec", "0.1").removesuffix("s"))
    stop_timeout_s = float(spec["props"].get("TimeoutStopSec", "90").removesuffix("s"))
    starts = 0
    while True:
        with open(log_path, "a") as log:
            child = subprocess.Popen(spec["command"], env=env, stdout=log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True, cwd="/")
            starts += 1
            write_json_atomic(p, {"unit": spec["unit"], "state": "active", "pid": child.pid, "monitor": os.getpid(),
                                  "command": spec["command"], "starts": starts})
            rc = _wait(child, p, stop_timeout_s)
        if not always or not p.exists() or json.loads(p.read_text())["state"] == "deactivating":
            break
        time.sleep(restart_s)
        if json.loads(p.read_text())["state"] == "deactivating":
            break
    u = json.loads(p.read_text())
    if u["state"] == "deactivating" or rc == 0:
        p.unlink()  # a transient unit that stopped cleanly is unloaded, as systemd does
    else:
        u.update(state="failed", result="exit-code" if rc > 0 else "signal", status=abs(rc))
        write_json_atomic(p, u)


def _wait(child, p: Path, stop_timeout_s: float) -> int:
    """The child's exit status; once the unit is stopped, SIGKILL after TimeoutStopSec, as systemd does."""
    import subprocess

    while True:
        try:
            return child.wait(timeout=0.1)
        except subprocess.TimeoutExpired:
            stopped_at = json.loads(p.read_text()).get("stopped_at") if p.exists() else None
            if stopped_at is not None and time.time() - stopped_at > stop_timeout_s:
                kill_group(child.pid, signal.SIGKILL)


if __name__ == "__main__" and sys.argv[1:2] == ["--monitor"]:
    monitor(sys.argv[2])
