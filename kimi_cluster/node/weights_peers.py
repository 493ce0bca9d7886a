"""The weights program's peers (run with kimi_cluster/node/fetch_weights.py on every node): each node serves its
finished,
verified files to the others over the private network, and asks theirs.

The peer token is read from a root-only file and never leaves the node: each peer request carries an HMAC of its
method, destination (host:port), path, time and a fresh nonce under the token (`peer_authorization`), which the
server checks against its own address, refusing a stale time or a nonce it has seen. The server serves a blob only
if it is still the regular file, of the manifest's size, that was committed (same device and inode), and opens it
without following a link.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import os
import re
import secrets
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol, cast
from urllib.parse import unquote

from kimi_cluster.node.weights import PEER_PORT
from kimi_cluster.node.weights_files import Cache, Entry, PeerFault, Unservable, log

# The peer server, facing whatever reaches the private address: a connection has this long to send its request line
# and headers with a valid token (a whole-request deadline, not per read, so a byte every few seconds does not keep
# it); after that, a transfer may wait --stall-seconds for each write. Connections beyond the cap are closed at once,
# before a thread or a byte of work is spent on them.
PEER_REQUEST_DEADLINE_S = 10.0
PEER_EXTRA_CONNECTIONS = 8  # beyond what the peers' own fetches and status polls can open at once
PEER_STATUS_MAX_BYTES = 256 * 1024 + 512  # a /status answer: per file name, up to its 1024 characters, quoted
PEER_STATUS_DEADLINE_S = 5.0  # for the whole /status answer
PEER_AUTH_SCHEME = "KimiPeer"
PEER_CLOCK_SKEW_S = 300  # how far apart two nodes' clocks (NTP-kept on cloud VMs) may be for a request to pass
PEER_LOG_EVERY_S = 10.0  # at most one line about refused or broken peer connections per this many seconds


class ServedNode(Protocol):
    """What the peer server reads of the node it serves for (fetch_weights.Node)."""

    args: argparse.Namespace
    by_name: dict[str, Entry]
    cache: Cache

    def status(self) -> dict[str, Any]: ...

    def done_snapshot(self) -> set[str]: ...


@dataclass
class Peer:
    rank: int
    url: str
    first_try: float
    last_ok: float | None = None
    done: set[str] = field(default_factory=set)
    complete: bool = False
    reachable: bool = False
    bytes_done: int = -1
    progress_at: float = 0.0
    dead: bool = False
    why: str = ""


def peer_url(spec: str) -> str:
    host, _, port = spec.rpartition(":") if spec.count(":") == 1 else (spec, "", "")
    return f"http://{host or spec}:{port or PEER_PORT}"


def _peer_mac(token: str, ts: int, nonce: str, method: str, dest: str, path: str) -> str:
    return hmac.new(token.encode(), f"{ts}\n{nonce}\n{method}\n{dest}\n{path}".encode(),
                    hashlib.sha256).hexdigest()


def peer_authorization(token: str, method: str, dest: str, path: str, now: float | None = None) -> str:
    """The Authorization value of one peer request to `dest` (the server's host:port, as peer_url has it): the token
    signs it and never travels (one nonce per request). Naming the destination makes it good at that server only:
    nonces are kept per server, so without it a request seen on its way to one node passed at every other."""
    ts, nonce = int(time.time() if now is None else now), secrets.token_hex(16)
    return f"{PEER_AUTH_SCHEME} ts={ts},nonce={nonce},mac={_peer_mac(token, ts, nonce, method, dest, path)}"


_PEER_AUTH = re.compile(PEER_AUTH_SCHEME + r" ts=(\d{1,12}),nonce=([0-9a-f]{32}),mac=([0-9a-f]{64})")


class PeerVerifier:
    """The server's side of peer_authorization: a valid MAC for this server's own address (host:port), a time within
    PEER_CLOCK_SKEW_S, a nonce not seen."""

    def __init__(self, token: str, address: str) -> None:
        self.token = token
        self.address = address
        self.seen: dict[str, float] = {}
        self.lock = threading.Lock()

    def check(self, header: str, method: str, path: str) -> bool:
        m = _PEER_AUTH.fullmatch(header)
        if not m:
            return False
        ts, nonce, mac = int(m.group(1)), m.group(2), m.group(3)
        now = time.time()
        if abs(now - ts) > PEER_CLOCK_SKEW_S:
            return False
        if not hmac.compare_digest(_peer_mac(self.token, ts, nonce, method, self.address, path), mac):
            return False
        with self.lock:
            if len(self.seen) > 1000:  # nonces older than the window can never pass the time check again
                self.seen = {n: t for n, t in self.seen.items() if now - t <= 2 * PEER_CLOCK_SKEW_S}
            if nonce in self.seen:
                return False  # a replay of a request already served
            self.seen[nonce] = now
        return True


def parse_status(body: bytes, revision: str, by_name: dict[str, Entry]) -> dict[str, Any]:
    """A peer's /status as {"done": [names], "complete": bool, "bytes_done": int}, or PeerFault naming the field.

    The peer is another node of this cluster, but whatever answers on its address is what this reads: every field is
    checked by type, the names against the manifest, so nothing it sends can raise elsewhere in the download.
    """
    try:
        st = json.loads(body)
    except ValueError:
        raise PeerFault("its /status answer is not JSON") from None
    if not isinstance(st, dict):
        raise PeerFault("its /status answer is not a JSON object")
    if st.get("revision") != revision:
        # Not a fault: a peer still on the previous revision, about to be restarted, says so. It counts as
        # unreachable, and is given up on after --peer-timeout like one that does not answer.
        raise ValueError(f"it serves revision {str(st.get('revision'))[:60]!r}, not {revision}")
    done, complete, nbytes = st.get("done"), st.get("complete"), st.get("bytes_done")
    if not isinstance(done, list) or not all(isinstance(n, str) and n in by_name for n in done):
        raise PeerFault("its /status 'done' is not a list of this checkpoint's file names")
    if not isinstance(complete, bool):
        raise PeerFault("its /status 'complete' is not true or false")
    if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
        raise PeerFault("its /status 'bytes_done' is not a byte count")
    return {"done": done, "complete": complete, "bytes_done": nbytes}


class _PeerHTTPServer(ThreadingHTTPServer):
    """ThreadingHTTPServer with a cap on connections and one short, rate-limited log line instead of tracebacks."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler], max_connections: int) -> None:
        # socketserver listens with a backlog of 5: every peer's streams connect at once when a file is whole, and a
        # connection past a full accept queue has its handshake's last ACK dropped, so its request waits for the
        # SYN-ACK to be sent again (1, 2, 4 s...). The queue holds as many as the server would serve.
        self.request_queue_size = max_connections
        super().__init__(address, handler)
        self.slots = threading.BoundedSemaphore(max_connections)
        self.max_connections = max_connections
        self.log_lock = threading.Lock()
        self.last_log = float("-inf")  # the first line always goes out, however soon after boot
        self.unlogged = 0

    def note(self, what: str) -> None:
        """One line per PEER_LOG_EVERY_S at most, counting the ones it held back: the log is on the root disk."""
        with self.log_lock:
            now = time.monotonic()
            if now - self.last_log < PEER_LOG_EVERY_S:
                self.unlogged += 1
                return
            more = f" (and {self.unlogged} more since the last such line)" if self.unlogged else ""
            self.last_log, self.unlogged = now, 0
        log(f"peer server: {what[:200]}{more}")

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.slots.acquire(blocking=False):
            self.note(f"{self.max_connections} connections open; closed one from {client_address[0]} at once")
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        exc = sys.exc_info()[1]
        self.note(f"connection from {client_address[0]} ended: {type(exc).__name__}")


class Server:
    """Serves this node's verified files to its peers: GET /status and GET /files/<name>, both behind the token."""

    def __init__(self, bind: str, port: int, token: str, node: ServedNode, max_connections: int = 64) -> None:
        self.node = node
        handler = _handler(token, f"{bind}:{port}", node)
        self.httpd = _PeerHTTPServer((bind, port), handler, max_connections)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()  # nothing listens once the download is over


class _DeadlineReader:
    """The request's reader until it is authorized: every read gets only the time left of one deadline."""

    def __init__(self, raw: Any, sock: socket.socket, seconds: float) -> None:
        self.raw, self.sock = raw, sock
        self.deadline = time.monotonic() + seconds

    def readline(self, limit: int = -1) -> bytes:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the request was not complete by its deadline")
        self.sock.settimeout(left)
        return bytes(self.raw.readline(limit))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.raw, name)


def _handler(token: str, address: str, node: ServedNode) -> type[BaseHTTPRequestHandler]:
    verifier = PeerVerifier(token, address)
    transfer_timeout = node.args.stall_seconds

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "kimi-weights-peer/1"
        timeout = PEER_REQUEST_DEADLINE_S  # socketserver sets it on the connection before anything is read

        def setup(self) -> None:
            super().setup()
            self.reader = _DeadlineReader(self.rfile, self.connection, PEER_REQUEST_DEADLINE_S)
            self.rfile = self.reader  # type: ignore[assignment]  # http.server only calls its readline

        def handle_one_request(self) -> None:
            # Each request on a kept-alive connection gets its own deadline, as the first one did.
            self.connection.settimeout(PEER_REQUEST_DEADLINE_S)
            self.reader.deadline = time.monotonic() + PEER_REQUEST_DEADLINE_S
            super().handle_one_request()

        def log_message(self, fmt: str, *args: Any) -> None:  # the log is the program's own lines only
            pass

        def _send(self, status: int, body: bytes, ctype: str = "application/json",
                  headers: dict[str, str] | None = None) -> None:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            if not verifier.check(self.headers.get("Authorization", ""), "GET", self.path):
                self.close_connection = True  # no second try on the same connection
                self._send(401, b'{"error": "unauthorized"}', headers={"Connection": "close"})
                return
            # Authorized: from here a slow reader of a large file is a peer, given the stall allowance per write.
            self.connection.settimeout(transfer_timeout)
            if self.path == "/status":
                self._send(200, json.dumps(node.status()).encode())
                return
            if not self.path.startswith("/files/"):
                self._send(404, b'{"error": "no such route"}')
                return
            e = node.by_name.get(unquote(self.path[len("/files/"):]))
            if e is None or e.name not in node.done_snapshot():
                self._send(404, b'{"error": "not here (yet)"}')
                return
            self._file(e)

        def _file(self, e: Entry) -> None:
            try:
                fd = node.cache.open_verified(e)
            except Unservable as exc:
                cast(_PeerHTTPServer, self.server).note(f"not serving {exc}")
                self._send(404, b'{"error": "not served: changed since it was verified"}')
                return
            with os.fdopen(fd, "rb") as fh:
                self._send_file(e, fh)

        def _send_file(self, e: Entry, fh: Any) -> None:
            start = 0
            rng = self.headers.get("Range", "")
            if rng.startswith("bytes=") and rng.endswith("-") and rng[6:-1].isdigit():
                start = int(rng[6:-1])
                if start >= e.size:
                    # RFC 9110 15.5.17: a range that starts at or past the end is unsatisfiable.
                    self._send(416, b'{"error": "range not satisfiable"}',
                               headers={"Content-Range": f"bytes */{e.size}"})
                    return
            self.send_response(206 if start else 200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(e.size - start))
            if start:
                self.send_header("Content-Range", f"bytes {start}-{e.size - 1}/{e.size}")
            self.end_headers()
            if e.size == start:
                return  # an empty file: sendfile refuses a count of 0
            try:
                self.wfile.flush()
                self.connection.sendfile(fh, start, e.size - start)
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True

    return Handler


# ---- the node --------------------------------------------------------------------------------------------------------


