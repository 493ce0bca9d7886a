"""Background processes of the sandbox: services `up` leaves running for later commands, and what fake nodes leave
behind; started detached, recorded by pid, and stopped by pid only.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


class ServiceError(Exception):
    """A service could not be started or stopped; the message says which and points at its log."""


@dataclass(frozen=True)
class Service:
    """One detached process and where it listens; `marker` is a word of its command line, checked before a signal so
    a recycled pid is never taken for it."""

    name: str
    pid: int
    host: str
    port: int
    marker: str
    log: str

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping) -> Service:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__})

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def running(self) -> bool:
        return _is(self.pid, self.marker) and port_open(self.host, self.port)

    def started_with(self, word: str) -> bool:
        """Whether its command line holds `word`: a service another release started may lack a flag."""
        return word in _cmdline(self.pid)


# Ports for services started later are drawn from here: above the well-known services many machines run, below the
# kernel's ephemeral range (Linux's default starts at 32768, IANA's and the BSDs' at 49152).
PORT_FLOOR = 20100
IANA_EPHEMERAL_RANGE = (49152, 65535)


def ephemeral_range() -> tuple[int, int]:
    """The ports the kernel gives outgoing connections and bind(port 0) (Linux: net.ipv4.ip_local_port_range)."""
    try:
        low, high = (int(word) for word in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        return IANA_EPHEMERAL_RANGE
    return low, high


def free_port(*hosts: str, span: int = 1, avoid: Collection[int] = ()) -> int:
    """A port free on every one of hosts (default 127.0.0.1) and on the wildcard address, for a service that binds
    it later; with span, the span - 1 ports above it are free too (an engine that binds beside its own port), and
    none of them is in avoid (ports already handed to something that has not bound them yet).

    The wildcard check sees a listener on any address: a service that binds them all (a Caddyfile's `:PORT`) fails
    on one held on another loopback address, and the fakes' loopback addresses are shared between tests.

    Not one from bind(port 0): that is an ephemeral port, which the kernel also hands to every outgoing connection
    (and keeps a minute in TIME_WAIT after it closes), so on a busy machine a port chosen now can belong to somebody's
    connection by the time the service binds it ("address already in use"). Below the ephemeral range only
    listeners take ports, and the bind check here sees those.
    """
    hosts = (*(hosts or ("127.0.0.1",)), "0.0.0.0")
    low, _ = ephemeral_range()
    pool = range(PORT_FLOOR, low) if low - PORT_FLOOR >= 1000 else range(1024, 65536)
    for _ in range(200):
        port = random.choice(pool)
        block = range(port, port + span)
        if block.stop > pool.stop or any(p in avoid for p in block):
            continue
        if all(port_free(host, p, time_wait_is_free=False) for p in block for host in hosts):
            return port
    raise ServiceError(f"no port in {pool.start}-{pool.stop - 1} is free on {', '.join(hosts)}")


def port_free(host: str, port: int, *, time_wait_is_free: bool = True) -> bool:
    """Whether a listener could bind host:port now; time_wait_is_free=False also counts a port still in TIME_WAIT
    as taken (no SO_REUSEADDR), the cautious answer for a port chosen now and bound later."""
    with socket.socket() as sock:
        if time_wait_is_free:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def port_open(host: str, port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def _cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return [w.decode(errors="replace") for w in fh.read().split(b"\0") if w]
    except OSError:
        return []


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has already ended
    except (OSError, IndexError):
        return False


def is_alive(pid: int) -> bool:
    """Whether `pid` is a live process (a zombie has already ended)."""
    return _alive(pid)


def _is(pid: int, marker: str) -> bool:
    return _alive(pid) and any(marker in word for word in _cmdline(pid))


def start(name: str, argv: Sequence[str], *, host: str, port: int, marker: str, log_dir: Path,
          env: Mapping[str, str] | None = None, timeout: float = 30.0) -> Service:
    """Start `argv` in its own session (it outlives this process), wait until it accepts connections on host:port."""
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{name}.log"
    full_env = {**os.environ, **(env or {})}
    full_env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), full_env.get("PYTHONPATH", "")) if p)
    full_env["PYTHONUNBUFFERED"] = "1"
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(list(argv), cwd=REPO_ROOT, env=full_env, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
    service = Service(name, proc.pid, host, port, marker, str(log_path))
    deadline = time.monotonic() + timeout
    while not port_open(host, port):
        if proc.poll() is not None:
            raise ServiceError(f"{name} exited with code {proc.returncode} at start; see {log_path}")
        if time.monotonic() >= deadline:
            stop(service)
            raise ServiceError(f"gave up after {timeout:g} s waiting for {name} to listen on {host}:{port}; "
                               f"see {log_path}")
        time.sleep(0.05)
    return service


def stop(service: Service, timeout: float = 10.0) -> bool:
    """SIGTERM, then SIGKILL after `timeout`; True once it is gone (or was not running)."""
    return terminate([service.pid], lambda pid: _is(pid, service.marker), timeout) == []


def terminate(pids: Iterable[int], still_ours=_alive, timeout: float = 10.0) -> list[int]:
    """Stop each pid (SIGTERM, then SIGKILL at the deadline); returns the pids that are still there."""
    targets = [pid for pid in pids if pid != os.getpid() and still_ours(pid)]
    for pid in targets:
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(_alive(p) for p in targets):
        time.sleep(0.05)
    for pid in [p for p in targets if _alive(p)]:
        _signal(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(_alive(p) for p in targets):
        time.sleep(0.05)
    return [p for p in targets if _alive(p)]


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


# How a process started by a fake node carries its node: the engine gives every node command SANDBOX_NODE_DIR (the
# docker hook's engine and the download unit's monitor inherit it); the download itself gets only HF_HOME.
NODE_MARKERS = ("SANDBOX_NODE_DIR", "FAKE_NODE_ROOT", "HF_HOME")


def _belongs_to(pid: int, place: str, names: Sequence[str]) -> bool:
    """Whether one of `names` in the process's environment points under `place`. Not its cwd or argv: a shell or
    pager someone opened in a node's directory is not the node's."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            entries = fh.read().split(b"\0")
    except OSError:
        return False
    prefixes = [f"{name}={place}".encode() for name in names]
    return any(entry == p or entry.startswith(p + b"/") for entry in entries for p in prefixes)


def _ancestors() -> set[int]:
    """This process and its parents: a test or shell started inside a node directory is not a node's process."""
    found, pid = set(), os.getpid()
    while pid > 1 and pid not in found:
        found.add(pid)
        try:
            with open(f"/proc/{pid}/stat") as fh:
                pid = int(fh.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            break
    return found


def processes_under(place: Path, names: Sequence[str] = NODE_MARKERS) -> list[int]:
    """Live processes of the fake nodes under `place`: engines, download units, whatever they started."""
    where = str(place.resolve())
    mine = _ancestors()
    return sorted(pid for pid in (int(e) for e in os.listdir("/proc") if e.isdigit())
                  if pid not in mine and _alive(pid) and _belongs_to(pid, where, names))


def processes_with_env(name: str, under: Path) -> list[int]:
    """Live processes (this one and its parents aside) whose environment variable `name` is `under` or lies below
    it: an interrupted run's Pulumi plugins, whose command line names no workdir but whose PULUMI_HOME does."""
    where, mine, found = str(under.resolve()), _ancestors(), []
    for pid in (int(e) for e in os.listdir("/proc") if e.isdigit()):
        if pid in mine or not _alive(pid):
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as fh:
                env = fh.read(1024 * 1024).split(b"\0")
        except OSError:
            continue
        value = next((v.split(b"=", 1)[1].decode(errors="replace") for v in env if v.startswith(name.encode() + b"=")),
                     None)
        if value is not None and (value == where or value.startswith(where + "/")):
            found.append(pid)
    return sorted(found)


def describe(pid: int) -> str:
    words = _cmdline(pid)
    text = " ".join(words)
    return f"pid {pid}: {text[:160]}{'...' if len(text) > 160 else ''}"


def python_module(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", module, *args]
