"""The fake SGLang's multi-node process group: its ranks meet at `--dist-init-addr`, and losing one hangs the others,
as SGLang 0.5.23 does.

What the real engine does (read from its source):
- Rank 0 holds a TCP store at `--dist-init-addr`; the other ranks keep trying to reach it until `--dist-timeout`, and
  only once all `--nnodes` have joined does the head load the model and serve HTTP (python/sglang/srt/distributed/
  parallel_state.py init_distributed_environment; torch's tcp:// rendezvous). A rank that never gets there exits.
- The group is built once: a rank cannot rejoin it (no re-forming path in python/sglang/srt/distributed/
  bootstrap.py outside elastic EP), so every rank must start again.
- When a peer disappears nothing notices: idle ranks sit in the scheduler's request broadcast on a gloo group with a
  2-hour timeout (python/sglang/srt/managers/scheduler_components/request_receiver.py), busy ones in an NCCL
  collective until the 300 s scheduler watchdog. They hang rather than exit within an `up`.
- The head's /health sends a one-token generate and answers 503 when nothing comes back within
  SGLANG_HEALTH_CHECK_TIMEOUT (20 s; python/sglang/srt/entrypoints/http_server.py); a worker's /health is a dummy
  that always answers 200 (python/sglang/srt/utils/common.py launch_dummy_health_check_server).

The fake's ranks keep one TCP connection each to the head and exchange a heartbeat on it: a connection that closes,
or stays silent for LOSS_S (a deleted VM's addresses just go quiet), is a lost peer, and from then on this rank is
hung for good. The head refuses late joiners once its group has formed.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

HEARTBEAT_S = 0.5
# Silence after which a peer counts as lost (the fake's own detection: the real ranks only find out by hanging).
LOSS_S = float(os.environ.get("FAKE_ENGINE_PEER_LOSS_SECONDS") or 3.0)
# What the head's /health waits for an answer before it says 503: SGLang's own variable and default (the sandbox
# shortens it with its FAKE_* knob, which reaches the fake nodes' engines).
HEALTH_TIMEOUT_S = float(os.environ.get("FAKE_ENGINE_HEALTH_CHECK_TIMEOUT")
                         or os.environ.get("SGLANG_HEALTH_CHECK_TIMEOUT") or 20)
# A forward that never returns trips SGLang's scheduler watchdog (--watchdog-timeout, 300 s, checked every half of
# it), which kills every SGLang process of the node 5 s later (python/sglang/srt/utils/watchdog.py).
WATCHDOG_S = float(os.environ.get("FAKE_ENGINE_WATCHDOG_SECONDS") or 300)
_HELLO_MAX = 64  # bytes of a joining rank's hello line: anything longer is not a rank of this group


def _log(text: str) -> None:
    print(f"fake-inference: {text}", file=sys.stderr, flush=True)


class Group:
    """One rank's view of its process group: `formed` once every rank has joined, `hung()` once a peer is lost."""

    def __init__(self, nnodes: int, rank: int, dist_init_addr: str, timeout_s: float) -> None:
        host, sep, port = dist_init_addr.rpartition(":")
        if not sep or not port.isdigit():
            raise ValueError(f"--dist-init-addr expects HOST:PORT, got {dist_init_addr!r}")
        if not 0 <= rank < nnodes:
            raise ValueError(f"--node-rank {rank} is not below --nnodes {nnodes}")
        self.nnodes, self.rank, self.address, self.timeout_s = nnodes, rank, (host, int(port)), timeout_s
        self.formed = threading.Event()
        self._lost_at: float | None = None
        self._lock = threading.Lock()
        self._peers: dict[int, socket.socket] = {}  # on the head: each worker's connection, by rank
        self._watchdog = False

    # what the server asks
    def hung(self) -> bool:
        return self._lost_at is not None

    def stall(self, stop: threading.Event) -> None:
        """A generation on a hung group: it never returns, and the watchdog ends the whole engine after WATCHDOG_S
        (only while the group works is the watchdog quiet: an idle scheduler is not watched)."""
        with self._lock:
            arm = not self._watchdog
            self._watchdog = True
        if arm:
            threading.Thread(target=self._bite, args=(stop,), daemon=True).start()
        stop.wait()

    def _bite(self, stop: threading.Event) -> None:
        if stop.wait(WATCHDOG_S + 5):
            return
        _log(f"rank {self.rank}: watchdog timeout: a forward batch took over {WATCHDOG_S:g} s; killing the engine")
        os._exit(1)

    def _lose(self, who: str, why: str) -> None:
        with self._lock:
            if self._lost_at is not None:
                return
            self._lost_at = time.monotonic()
        _log(f"rank {self.rank}: {who} is lost ({why}); this rank hangs in its collectives, as SGLang's do (it does "
             "not exit on its own, and cannot rejoin: every rank must start again)")

    # start-up
    def start(self, stop: threading.Event) -> None:
        target = self._serve if self.rank == 0 else self._join
        threading.Thread(target=target, args=(stop,), name="fake-group", daemon=True).start()

    def _serve(self, stop: threading.Event) -> None:
        """The head: accept every other rank once, then watch them all."""
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("", self.address[1]))  # torch's store listens on every address of the node
        listener.listen(self.nnodes * 2)
        listener.settimeout(0.5)
        _log(f"rank 0 waits for {self.nnodes - 1} more ranks at port {self.address[1]}")
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            if self.formed.is_set():
                conn.close()  # a formed group takes no one new
                continue
            threading.Thread(target=self._admit, args=(conn, stop), daemon=True).start()

    def _admit(self, conn: socket.socket, stop: threading.Event) -> None:
        conn.settimeout(LOSS_S)
        try:
            hello = conn.recv(_HELLO_MAX).decode("ascii", "replace").split()
            rank = int(hello[1]) if len(hello) == 2 and hello[0] == "rank" and hello[1].isdigit() else -1
        except (OSError, ValueError):
            rank = -1
        with self._lock:
            fresh = 0 < rank < self.nnodes and rank not in self._peers and not self.formed.is_set()
            if fresh:
                self._peers[rank] = conn
                if len(self._peers) == self.nnodes - 1:
                    self.formed.set()
        if not fresh:
            conn.close()
            return
        _log(f"rank 0: rank {rank} joined ({len(self._peers)} of {self.nnodes - 1})")
        why = self._beat(conn, stop)
        if why and not stop.is_set():
            if self.formed.is_set():
                self._lose(f"rank {rank}", why)
            else:  # still at the rendezvous: the rank may come again
                with self._lock:
                    self._peers.pop(rank, None)
                conn.close()

    def _join(self, stop: threading.Event) -> None:
        """A worker: reach the head's store until --dist-timeout (then exit, as the real rank does), then watch it."""
        deadline = time.monotonic() + self.timeout_s
        while not stop.is_set():
            try:
                conn = socket.create_connection(self.address, timeout=2)
                conn.sendall(f"rank {self.rank}\n".encode())
                break
            except OSError:
                if time.monotonic() > deadline:
                    _log(f"rank {self.rank}: no head at {self.address[0]}:{self.address[1]} within "
                         f"{self.timeout_s:g} s (--dist-timeout); exiting")
                    os._exit(1)
                stop.wait(0.5)
        else:
            return
        conn.settimeout(LOSS_S)
        self.formed.set()
        _log(f"rank {self.rank} joined the head at {self.address[0]}:{self.address[1]}")
        why = self._beat(conn, stop)
        if why and not stop.is_set():
            self._lose("the head", why)

    def _beat(self, conn: socket.socket, stop: threading.Event) -> str:
        """Heartbeats both ways on one connection until it closes or goes silent (why, then) or this rank hangs.
        The connection stays open: a hung rank holds its sockets."""
        def send() -> None:
            while not stop.wait(HEARTBEAT_S) and not self.hung():
                try:
                    conn.sendall(b".")
                except OSError:
                    return
        threading.Thread(target=send, daemon=True).start()
        why = ""
        while not stop.is_set() and not self.hung():
            try:
                if not conn.recv(64):
                    why = "its connection closed"
                    break
            except TimeoutError:
                why = f"silent for {LOSS_S:g} s"
                break
            except OSError as exc:
                why = str(exc)
                break
        return why


class _DummyHealth(BaseHTTPRequestHandler):
    """A worker's /health, /health_generate and /ping: 200 whatever its ranks do, as SGLang's dummy server."""

    def do_GET(self) -> None:
        known = self.path.split("?", 1)[0] in ("/health", "/health_generate", "/ping")
        self.send_response(200 if known else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *_args: object) -> None:
        pass


def serve_dummy_health(addresses: list[tuple[str, int]]) -> list[ThreadingHTTPServer]:
    """SGLang's worker nodes answer health checks on the API's address with a dummy server (started beside the
    schedulers), which says nothing about the ranks."""
    servers = []
    for host, port in addresses:
        server = ThreadingHTTPServer((host, port), _DummyHealth)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True).start()
        servers.append(server)
    return servers
