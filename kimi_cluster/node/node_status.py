"""What one node is doing now, as one JSON object on stdout: runs ON the node (standard library only).

    python3 - --node-root / --storage-path /ephemeral --repo-folder models--org--name --bytes-total N < node_status.py

`kimi-cluster status` sends this file on stdin over the stack's SSH connection (or however the stack's node
commands run) and reads back:

- steps: each step script kept in ~/.kimi-cluster (when it was written, i.e. started), and which are running now;
- weights: the progress file the weights step keeps (`<storage>/kimi/progress/weights.json`), or, before a weights
  program writes one, the bytes under the model's hub cache against the checkpoint size;
- the weights unit's state (systemd `kimi-weights`), the last line of its log;
- engine: `docker inspect kimi-engine`: state, restart count, start time, exit code.

It prints no secret: it reads no file under /etc/kimi-cluster and passes only the container's state through.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any

PROGRESS_FILE = "kimi/progress/weights.json"  # kimi_cluster/node/weights.py PROGRESS_FILE (this file runs without it)
CONTAINER = "kimi-engine"
PROXY_CONTAINER = "kimi-proxy"  # kimi_cluster/plan/proxy.py CONTAINER_NAME
WEIGHTS_UNIT = "kimi-weights"


def _run(argv: list[str], timeout: float = 10.0) -> tuple[int, str]:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return 127, str(exc)
    return done.returncode, done.stdout.strip()


def _as_root(argv: list[str]) -> list[str]:
    # The steps run docker and systemctl as root (`sudo -n bash <step>.sh`); so does this, without a password.
    return argv if os.geteuid() == 0 else ["sudo", "-n", *argv]


def running_scripts(script_dir: str, names: list[str]) -> set[str]:
    """Steps whose kept script a process is executing now (its path on a command line)."""
    wanted = {os.path.join(script_dir, f"{step}.sh"): step for step in names}
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                args = fh.read().decode(errors="replace").split("\0")
        except OSError:
            continue
        for arg in args:
            if arg in wanted:
                found.add(wanted[arg])
    return found


def steps(script_dir: str, names: list[str]) -> list[dict[str, Any]]:
    """The kept script of each of `names` (the step table's, in its order: the operator passes them) found here."""
    running = running_scripts(script_dir, names)
    out = []
    for step in names:
        path = os.path.join(script_dir, f"{step}.sh")
        if os.path.exists(path):
            out.append({"step": step, "started_at": os.path.getmtime(path), "running": step in running})
    return out


def _tree_bytes(path: str) -> tuple[int, int, float]:
    """(bytes, files, newest mtime) of the real files under path; hub cache symlinks are not counted twice."""
    total, files, newest = 0, 0, 0.0
    for root, _dirs, names in os.walk(path):
        for name in names:
            full = os.path.join(root, name)
            if os.path.islink(full):
                continue
            try:
                st = os.stat(full)
            except OSError:
                continue
            total, files, newest = total + st.st_size, files + 1, max(newest, st.st_mtime)
    return total, files, newest


def weights(storage: str, repo_folder: str, bytes_total: int) -> dict[str, Any] | None:
    path = os.path.join(storage, PROGRESS_FILE)
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
        if isinstance(data, dict) and isinstance(data.get("bytes_done"), (int, float)):
            keys = ("bytes_done", "bytes_total", "files_done", "files_total", "updated_at", "hub_bytes",
                    "peer_bytes")
            return {**{k: data.get(k) for k in keys}, "source": "progress file"}
    except (OSError, ValueError):
        pass
    blobs = os.path.join(storage, "hf", "hub", repo_folder, "blobs")
    if not os.path.isdir(blobs):
        return None
    done, files, newest = _tree_bytes(blobs)
    return {"bytes_done": done, "bytes_total": bytes_total or None, "files_done": files, "files_total": None,
            "updated_at": newest or None, "source": "size of the hub cache"}


def unit_state(unit: str) -> str:
    code, out = _run(_as_root(["systemctl", "is-active", unit]))
    return out.splitlines()[-1] if out else ("unknown" if code == 127 else "inactive")


def last_line(path: str) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(fh.tell() - 4096, 0))
            lines = fh.read().decode(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return lines[-1][:200] if lines else ""


def engine(container: str = CONTAINER) -> dict[str, Any]:
    code, out = _run(_as_root(["docker", "inspect", container]))
    if code != 0:
        return {"state": "absent" if "No such" in out or not out else "unknown", "restart_count": 0}
    try:
        info = json.loads(out)[0]
    except (ValueError, IndexError, KeyError):
        return {"state": "unknown", "restart_count": 0}
    state = info.get("State") or {}
    return {"state": state.get("Status") or "unknown", "restarting": bool(state.get("Restarting")),
            "restart_count": int(info.get("RestartCount") or 0), "started_at": state.get("StartedAt"),
            "exit_code": state.get("ExitCode")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--node-root", default="/")
    ap.add_argument("--storage-path", default="/ephemeral")
    ap.add_argument("--repo-folder", required=True)
    ap.add_argument("--bytes-total", type=int, default=0)
    ap.add_argument("--steps", default="", help="the step names, comma-separated, in order (the step table's)")
    args = ap.parse_args(argv)
    root = os.path.realpath(args.node_root).rstrip("/")
    storage = root + args.storage_path
    script_dir = os.path.expanduser("~/.kimi-cluster")
    report = {
        "at": time.time(),
        "steps": steps(script_dir, [n for n in args.steps.split(",") if n]),
        "weights": weights(storage, args.repo_folder, args.bytes_total),
        "weights_unit": unit_state(WEIGHTS_UNIT),
        "weights_log": last_line(os.path.join(root, "var/log/kimi-cluster/weights.log")),
        "engine": engine(),
        "proxy": engine(PROXY_CONTAINER),  # a one-replica head's proxy, or the front's (replicas >= 2)
    }
    json.dump(report, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
