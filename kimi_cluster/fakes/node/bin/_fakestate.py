"""The fake node's state on disk and what every stub uses: the call log, atomic and locked JSON files, counters,
the image's disks, docker's daemon state, and whether a process lives (see _fakenode.py)."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import sys
import time
from contextlib import contextmanager
from pathlib import Path

# Every stub call is a new interpreter (some 1,400 a suite), so what only some calls need is imported where it is
# used: subprocess (about 8 ms) by the calls that start a process, typing (about 4 ms) by the type checker alone.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import NoReturn

# A test names the root; in the sandbox each node's directory is its root (one value cannot serve many
# nodes, so the engine's per-node variable is the fallback).
ROOT = Path(os.environ.get("FAKE_NODE_ROOT") or os.environ.get("SANDBOX_NODE_DIR") or "/nonexistent-fake-node")
STATE = ROOT / "var/lib/fake-node"
DOCKER = STATE / "docker"
CONTAINERS = DOCKER / "containers"
UNITS = STATE / "units"
DEFAULT_DOCKER_ROOT = "/var/lib/docker"


def record(tool: str, argv: list[str]) -> None:
    STATE.mkdir(parents=True, exist_ok=True)
    with open(STATE / "calls.jsonl", "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        fh.write(json.dumps({"tool": tool, "argv": argv, "t": time.time()}) + "\n")


def write_json_atomic(path: Path, data: dict) -> None:
    """Readers poll these files while the monitor rewrites them: never let one see half a file."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


@contextmanager
def locked_json(path: Path, default: dict):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        data = json.loads(path.read_text()) if path.exists() else json.loads(json.dumps(default))
        yield data
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1))
        os.replace(tmp, path)


def counter(name: str) -> int:
    """Increments and returns a named counter (how many times something was asked)."""
    with locked_json(STATE / "counters.json", {}) as c:
        c[name] = c.get(name, 0) + 1
        return c[name]


def boot() -> None:
    """What the VM image provides before any command runs: the disks in FAKE_NODE_DISKS exist (e.g. "ephemeral")."""
    for disk in filter(None, (d.strip().strip("/") for d in os.environ.get("FAKE_NODE_DISKS", "").split(","))):
        (ROOT / disk).mkdir(parents=True, exist_ok=True)


def fail(msg: str, code: int = 1) -> NoReturn:
    print(msg, file=sys.stderr)
    sys.exit(code)


DOCKER_DEFAULT = {"running": True, "root": DEFAULT_DOCKER_ROOT, "images": []}


def docker_state() -> dict:
    p = DOCKER / "state.json"
    return json.loads(p.read_text()) if p.exists() else dict(DOCKER_DEFAULT)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    try:  # a zombie counts as gone
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


def kill_group(pid: int, sig: int = signal.SIGTERM) -> None:
    try:
        os.killpg(pid, sig)
    except OSError:
        pass
