"""What bench_replicas reads beside its clients: the front's resuming layer (its /health, its log, its process's
memory), the front's Caddy log, the replicas' engines (their request counters), and the observer that takes a lost
replica's address and records what still reaches it."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

from kimi_cluster.fakes.node_fabric import Fabric, FabricConfig

# The observer's listener, run inside a namespace that takes the lost replica's address: one line per connection,
# its arrival time (CLOCK_MONOTONIC, the same clock in every process of this machine), the peer's address and its
# request line. A thread per connection, so one slow client cannot hold the others in the backlog until they give up
# (which would show as a connection with no request line at a late time).
_LISTENER = """
import socket, sys, threading, time
lock = threading.Lock()
def serve(conn, peer, at):
    data = b""
    with conn:
        conn.settimeout(5)
        try:
            while b"\\r\\n" not in data and len(data) < 4096:
                chunk = conn.recv(4096)
                if not chunk:
                    break
                data += chunk
        except OSError:
            pass
    line = data.split(b"\\r\\n", 1)[0].decode(errors="replace") or "(no request line)"
    with lock:
        print(at, peer[0], line, flush=True)
sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
sock.bind((sys.argv[1], int(sys.argv[2])))
sock.listen(64)
print("listening", flush=True)
while True:
    conn, peer = sock.accept()
    threading.Thread(target=serve, args=(conn, peer, time.monotonic()), daemon=True).start()
"""


class Observer:
    """Takes the lost replica's address (a bare namespace on the fake nodes' bridge, once its VM's is gone) and its
    engine port, records each request line that reaches it with its time and its sender, and hangs up."""

    def __init__(self, fabric: Fabric, host: str, port: int) -> None:
        self.seen: list[tuple[float, str, str]] = []
        self.fabric = fabric
        self.namespace = fabric.attach(host)
        self.proc = subprocess.Popen(["ip", "netns", "exec", self.namespace, sys.executable, "-c", _LISTENER, host,
                                      str(port)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        assert self.proc.stdout is not None
        if self.proc.stdout.readline().strip() != "listening":
            raise RuntimeError(f"the observer could not listen on {host}:{port}")
        self.bound_at = time.monotonic()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            at, peer, request = line.rstrip("\n").split(" ", 2)
            self.seen.append((float(at), peer, request))

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait(10)
        self.thread.join(2)
        self.fabric.end_namespace(self.namespace)


# Run inside the front's namespace (the resuming layer listens on the front's loopback only), asking until the
# replica has a generation or the wait is over: one process for the whole wait, not one per question.
_GENERATIONS = """
import json, sys, time, urllib.request
port, replica, deadline = int(sys.argv[1]), sys.argv[2], time.monotonic() + float(sys.argv[3])
while True:
    with urllib.request.urlopen("http://127.0.0.1:%d/health" % port, timeout=5) as answer:
        count = json.loads(answer.read()).get("generating", {}).get(replica, 0)
    if count or time.monotonic() >= deadline:
        print(count)
        break
    time.sleep(0.05)
"""


def generations_on(fabric: FabricConfig, front: str, replica_url: str, wait_s: float) -> int:
    """The generations the front's resuming layer runs on `replica_url`, asked until there is one or wait_s has
    passed (0 without a resuming layer: SGLang, or resumeStreams off)."""
    from kimi_cluster.settings import RESUME_PORT

    done = subprocess.run(["ip", "netns", "exec", fabric.namespace(front), sys.executable, "-c", _GENERATIONS,
                           str(RESUME_PORT), replica_url, str(wait_s)], capture_output=True, text=True,
                          timeout=wait_s + 30)
    if done.returncode != 0:
        return 0  # nothing listens there: no resuming layer
    return int(done.stdout.strip() or 0)


def resume_log_sizes(front_dir: Path, empty: bool = False) -> dict[Path, int]:
    """The front's resuming-layer log (kimi_cluster/node/resume logs to /var/log/kimi-cluster/resume.log), each with
    its size now, or 0 with `empty`: what resume_log_lines reads from."""
    return {p: 0 if empty else p.stat().st_size for p in front_dir.glob("**/kimi-cluster/resume.log")}


def resume_log_lines(since: dict[Path, int], marker: str) -> list[str]:
    """The lines holding `marker` written to each log after the size `since` gives it."""
    return [line for path, size in since.items()
            for line in path.read_bytes()[size:].decode(errors="replace").splitlines() if marker in line]


def front_tries(front_dir: Path, upstream: str, since: float) -> list[float]:
    """Seconds after `since` at which the front's Caddy logged a proxied request to `upstream` failing (its log is
    JSON lines; the active health checker's own lines are left out: it keeps probing a lost replica on purpose)."""
    log = front_dir / "var/lib/fake-node/docker/containers/kimi-proxy.log"
    out = []
    for line in log.read_text(errors="replace").splitlines() if log.exists() else []:
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if (isinstance(entry, dict) and upstream in (entry.get("upstream"), entry.get("host"))
                and "health_checker" not in str(entry.get("logger")) and float(entry.get("ts") or 0) >= since):
            out.append(float(entry["ts"]) - since)
    return out



# Run inside the front's namespace (a replica's engine port admits the front alone): each replica's /metrics, which
# vLLM serves without the key, as {url: text or the error}.
_METRICS = """
import json, sys, urllib.request
out = {}
for url in sys.argv[1:]:
    try:
        with urllib.request.urlopen(url + "/metrics", timeout=10) as answer:
            out[url] = answer.read().decode(errors="replace")
    except OSError as err:
        out[url] = "error: %s" % err
print(json.dumps(out))
"""
# The counter of requests an engine served, as vLLM names it. The fake engines count a request when they begin to
# answer it (kimi_cluster/fakes/inference/handler.py, Server.count), not when it succeeds: a request cut and sent
# again counts on both replicas. A request they refuse (a 4xx, a 5xx such as an image they cannot fetch) is not
# counted.
REQUESTS_COUNTER = "vllm:request_success_total"


def engine_requests(fabric: FabricConfig, front: str, replica_urls: list[str]) -> dict[str, int | None]:
    """The requests each replica's engine has begun to answer (REQUESTS_COUNTER), asked from the front; None for one
    that did not answer."""
    done = subprocess.run(["ip", "netns", "exec", fabric.namespace(front), sys.executable, "-c", _METRICS,
                           *replica_urls], capture_output=True, text=True, timeout=60)
    texts = json.loads(done.stdout) if done.returncode == 0 and done.stdout.strip() else {}
    return {url: counter(texts.get(url, ""), REQUESTS_COUNTER) for url in replica_urls}


def counter(metrics: str, name: str) -> int | None:
    """The sum of a counter over its labels in Prometheus' text format, or None if the text has no such counter."""
    values = [float(line.rsplit(None, 1)[1]) for line in metrics.splitlines()
              if line.startswith((name + "{", name + " ")) and len(line.split()) >= 2]
    return round(sum(values)) if values else None


LAYER_UNIT = "kimi-resume"  # kimi_cluster/plan/resume.py UNIT


def layer_pid(front_dir: Path) -> int | None:
    """The resuming layer's process: the MainPID the front's systemd records for its unit (the sandbox's fake
    systemd keeps it in the node's var/lib/fake-node/units/kimi-resume.json; on a VM, `systemctl show -p MainPID`)."""
    unit = front_dir / "var/lib/fake-node/units" / f"{LAYER_UNIT}.json"
    try:
        pid = json.loads(unit.read_text()).get("pid")
    except (OSError, ValueError):
        return None
    return pid if isinstance(pid, int) and pid > 0 else None


def reset_peak(pid: int) -> bool:
    """Start the process's peak resident memory (VmHWM) again from its present size (proc(5), clear_refs: 5)."""
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def memory_kib(status: str) -> dict[str, int]:
    """VmHWM (the peak resident set) and VmRSS (the present one) from a /proc/<pid>/status text, in KiB."""
    out = {}
    for line in status.splitlines():
        key, _, value = line.partition(":")
        if key in ("VmHWM", "VmRSS") and value.split() and value.split()[0].isdigit():
            out[key] = int(value.split()[0])
    return out


def process_memory(pid: int) -> dict[str, int]:
    """memory_kib of a running process (the front's processes are this machine's: its namespace is the network's
    only); empty once it is gone."""
    try:
        return memory_kib(Path(f"/proc/{pid}/status").read_text())
    except OSError:
        return {}
