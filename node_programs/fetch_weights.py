#!/usr/bin/env python3
"""Runs on every node: fetch one pinned checkpoint into the Hugging Face cache, each file from the hub once per cluster.

With peers, the files are split between the nodes by size (components/weights.py, the same split on every node);
each node downloads its share from the hub and serves its finished, verified files to the others over the private
network, while it fetches every other file from its owner as soon as that file is complete there. A peer that stops
answering or stops making progress loses its share to the survivors, who take it from the hub. Alone, a node
downloads every file from the hub.

Every file is hashed while it is written (sha256 for LFS files, the git blob id for small ones) and compared with
the hub's manifest; a mismatch deletes the file and fetches it again from the hub, once, then fails naming it.
Verified files are recorded (size, hash, mtime), so a re-run keeps them without reading them again, and the check
step compares the record with the manifest instead of reading 1.56 TB a second time.

Transport: huggingface_hub for the manifest, the file URLs and the auth headers; httpx2 (the HTTP client
huggingface_hub itself uses, so nothing new is installed on the node) for the streams; Python's http.server for the
peers. The peer token is read from a root-only file and never leaves the node: each peer request carries an HMAC of
its method, destination (host:port), path, time and a fresh nonce under the token (`peer_authorization`), which the
server checks against its own address, refusing a stale time or a nonce it has seen. So whatever answers on a
peer's address (a process that took the port first, a sniffer on the private network) learns no token, and cannot
replay what it saw, at that peer or any other.

The engine may run beside the peer server (a model-revision change, a replica feeding its re-created twin), as root
in its container, with the cache mounted read-only but possibly swapped by an older launch: the server serves a
blob only if it is still the regular file, of the manifest's size, that was committed (same device and inode), and
opens it without following a link, so a blob turned into a link to a host secret is refused, not sent.
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
import stat
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, cast
from urllib.parse import quote, unquote

import httpx2
from huggingface_hub import HfApi, hf_hub_url
from huggingface_hub.utils import build_hf_headers

from components.hub_names import UnsafeName, checked_etag, checked_name
from components.weights import PEER_PORT, is_shard, owners

CHUNK = 1024 * 1024
HUB_ATTEMPTS = 5  # per file, for dropped connections and 5xx/429; each retry resumes where the last one stopped
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


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S', time.gmtime())}] {msg}", flush=True)


class Fatal(Exception):
    """Stops the whole download: a file the hub refuses, or a file that failed its hash twice."""


class Corrupt(Exception):
    """A file whose bytes do not hash to the manifest's value."""


class PeerFault(Exception):
    """A peer that answered out of shape or too slowly: treated as dead, its files taken from the hub."""


class Unservable(Exception):
    """A verified file whose blob is no longer the file that was committed: never sent to a peer."""


@dataclass(frozen=True)
class Entry:
    name: str
    size: int
    sha256: str | None  # LFS files
    git_sha1: str | None  # small files kept in git

    @property
    def etag(self) -> str:
        """The blob name in the Hugging Face cache: the sha256 for LFS files, the git blob id for the others."""
        return self.sha256 or self.git_sha1 or ""

    def hasher(self) -> Any:
        if self.sha256:
            return hashlib.sha256()
        h = hashlib.sha1()
        h.update(b"blob %d\0" % self.size)  # git hashes a header, then the content
        return h


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repo", required=True)
    ap.add_argument("--revision", required=True, help="the pinned 40-hex commit")
    ap.add_argument("--cache-dir", required=True, help="the hub cache, e.g. /ephemeral/hf/hub")
    ap.add_argument("--record", required=True, help="JSON record of the verified files of this revision")
    ap.add_argument("--progress-file", required=True, help="JSON progress, rewritten every --poll-seconds")
    ap.add_argument("--result-file", help="gets 'ok <revision>' or 'failed <revision> <reason>'")
    ap.add_argument("--token-file", help="file holding the hub token (anonymous if missing or empty)")
    ap.add_argument("--endpoint", default=os.environ.get("HF_ENDPOINT") or None, help="hub endpoint")
    ap.add_argument("--workers", type=int, default=16, help="parallel hub downloads (as many again from peers)")
    ap.add_argument("--rank", type=int, default=0, help="this node's index in --peers")
    ap.add_argument("--peers", default="", help="every node's private address in rank order, host[:port],...")
    ap.add_argument("--peer-token-file", help="root-only file with the cluster's peer token (needed with peers)")
    ap.add_argument("--peer-timeout", type=float, default=300.0,
                    help="seconds a peer may stay unreachable (also at start-up) before its share goes to the hub")
    ap.add_argument("--stall-seconds", type=float, default=180.0,
                    help="seconds without progress after which a peer or a stream counts as stalled")
    ap.add_argument("--peer-min-rate", type=float, default=8e6,
                    help="bytes/s below which a whole transfer from a peer is cut off (its deadline is the file's "
                         "size at this rate, plus --stall-seconds); the file then comes from the hub")
    ap.add_argument("--poll-seconds", type=float, default=1.0, help="peer status and progress file interval")
    ap.add_argument("--report-seconds", type=float, default=30.0, help="progress line interval in the log")
    ap.add_argument("--source-address", help="local address for hub connections (default: the system's choice)")
    ap.add_argument("--serve-complete", action="store_true",
                    help="with peers: a node that already has every file still serves them until each peer has them "
                         "too (replicas: a re-created replica fetches from its twin, not from the hub)")
    return ap.parse_args(argv)


def read_secret(path: str | None) -> str | None:
    if not path or not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as fh:
        return fh.read().strip() or None


def write_json(path: str, obj: Any) -> None:
    """Write, then rename: a reader (the check step, the status command) never sees half a file."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(obj, fh)
    os.replace(tmp, path)


def hub_manifest(args: argparse.Namespace, token: str | None) -> list[Entry]:
    """Every file of the pinned revision with its size and recorded hash, from the hub's API (retried)."""
    api = HfApi(endpoint=args.endpoint)
    for attempt in range(1, HUB_ATTEMPTS + 1):
        try:
            info = api.model_info(args.repo, revision=args.revision, files_metadata=True, token=token)
            break
        except (httpx2.TransportError, httpx2.HTTPStatusError) as exc:
            status = getattr(getattr(exc, "response", None), "status_code", None)
            if attempt == HUB_ATTEMPTS or (status is not None and status < 500 and status != 429):
                raise
            time.sleep(min(2**attempt, 30))
    if info.sha and info.sha != args.revision:
        raise Fatal(f"the hub resolved {args.revision} to {info.sha}; pin the full commit hash")
    out = []
    for s in info.siblings or []:
        try:
            # Every name is joined to the snapshot folder and every hash to the blobs folder, as root.
            name = checked_name(s.rfilename)
            if isinstance(s.size, bool) or not isinstance(s.size, int) or s.size < 0:
                raise Fatal(f"the hub's manifest gives no size for {name}")
            etag = checked_etag(name, s.lfs.sha256 if s.lfs else s.blob_id)
        except UnsafeName as exc:
            raise Fatal(str(exc)) from None
        out.append(Entry(name, s.size, etag if s.lfs else None, None if s.lfs else etag))
    return out


# ---- the local cache -----------------------------------------------------------------------------------------------


class Cache:
    """The Hugging Face cache layout (blobs/<etag>, snapshots/<revision>/<name> -> ../../blobs/<etag>), so the
    engine and huggingface_hub read the files as if snapshot_download had put them there, plus the record."""

    def __init__(self, cache_dir: str, repo: str, revision: str, record_path: str) -> None:
        self.repo_dir = os.path.join(cache_dir, "models--" + repo.replace("/", "--"))
        self.blobs = os.path.join(self.repo_dir, "blobs")
        self.snapshot = os.path.join(self.repo_dir, "snapshots", revision)
        self.revision = revision
        self.record_path = record_path
        self.lock = threading.Lock()
        self.record: dict[str, Any] = {"revision": revision, "complete": False, "files": {}}
        try:
            with open(record_path, encoding="utf-8") as fh:
                loaded = json.load(fh)
            if loaded.get("revision") == revision:
                self.record = loaded
        except (OSError, ValueError):
            pass
        os.makedirs(self.blobs, exist_ok=True)
        os.makedirs(self.snapshot, exist_ok=True)

    def blob(self, e: Entry) -> str:
        return os.path.join(self.blobs, e.etag)

    def link(self, e: Entry) -> str:
        return os.path.join(self.snapshot, e.name)

    def is_verified(self, e: Entry) -> bool:
        """True if this file was hashed on an earlier run and has not changed since (same size and mtime)."""
        rec = self.record["files"].get(e.name)
        if not rec or rec.get("etag") != e.etag or rec.get("size") != e.size:
            return False
        try:
            st = os.stat(self.link(e))  # follows the link to the blob
            blob = os.lstat(self.blob(e))
        except OSError:
            return False
        if not stat.S_ISREG(blob.st_mode) or (blob.st_dev, blob.st_ino) != (st.st_dev, st.st_ino):
            return False  # the snapshot link leads elsewhere, or the blob itself is a link
        if "ino" not in rec:
            # A record from before inodes were kept: this check is its commit's, so the peer server may serve it.
            rec.update(dev=st.st_dev, ino=st.st_ino)
        return (st.st_size == e.size and st.st_mtime_ns == rec.get("mtime_ns")
                and (st.st_dev, st.st_ino) == (rec.get("dev"), rec.get("ino")))

    def commit(self, e: Entry, tmp: str) -> None:
        """A verified download becomes the blob, the snapshot link and a line in the record."""
        os.replace(tmp, self.blob(e))
        link = self.link(e)
        os.makedirs(os.path.dirname(link), exist_ok=True)
        target = os.path.relpath(self.blob(e), os.path.dirname(link))
        if os.path.lexists(link):
            os.unlink(link)
        os.symlink(target, link)
        st = os.lstat(self.blob(e))
        with self.lock:
            # The device and inode name the very file that was verified: the peer server serves that file only.
            self.record["files"][e.name] = {"etag": e.etag, "size": e.size, "mtime_ns": st.st_mtime_ns,
                                            "dev": st.st_dev, "ino": st.st_ino,
                                            "sha256" if e.sha256 else "git_sha1": e.etag}
            write_json(self.record_path, self.record)

    def open_verified(self, e: Entry) -> int:
        """A read descriptor on e's blob, if it is still the regular file of e's size committed for it (same device
        and inode); Unservable otherwise. The path is opened with O_PATH and O_NOFOLLOW, which neither follows a
        link in its last part nor opens a device or FIFO; a link earlier in the path leads to another inode, which
        the record refuses. Reading reopens that descriptor (/proc/self/fd, Linux), never the path again, so the
        file read is the file checked."""
        with self.lock:
            rec = dict(self.record["files"].get(e.name) or {})
        try:
            pfd = os.open(self.blob(e), os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:
            raise Unservable(f"{e.name}: its blob cannot be opened ({os.strerror(exc.errno or 0)})") from None
        try:
            st = os.fstat(pfd)
            if not stat.S_ISREG(st.st_mode):
                raise Unservable(f"{e.name}: its blob is no longer a regular file")
            if (st.st_size, st.st_dev, st.st_ino) != (e.size, rec.get("dev"), rec.get("ino")) \
                    or rec.get("etag") != e.etag:
                raise Unservable(f"{e.name}: its blob is not the file verified for it")
            return os.open(f"/proc/self/fd/{pfd}", os.O_RDONLY | os.O_CLOEXEC)
        finally:
            os.close(pfd)

    def finish(self, manifest: list[Entry]) -> None:
        with self.lock:
            self.record["complete"] = True
            self.record["manifest"] = [e.__dict__ for e in manifest]
            write_json(self.record_path, self.record)

    def recorded_manifest(self) -> list[Entry] | None:
        """The manifest of a download that finished earlier, so a re-run can vouch for it without the hub."""
        if not self.record.get("complete"):
            return None
        try:
            return [Entry(**m) for m in self.record["manifest"]]
        except (KeyError, TypeError):
            return None


# ---- streams: the hub and the peers --------------------------------------------------------------------------------


class Counters:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.hub = 0
        self.peer = 0
        self.inflight: dict[str, int] = {}

    def add(self, name: str, n: int, from_hub: bool) -> None:
        with self.lock:
            self.inflight[name] = self.inflight.get(name, 0) + n
            if from_hub:
                self.hub += n
            else:
                self.peer += n

    def drop(self, name: str) -> None:
        with self.lock:
            self.inflight.pop(name, None)


def stream_to(client: httpx2.Client, url: str, headers: dict[str, str], e: Entry, tmp: str, counters: Counters,
              from_hub: bool, attempts: int, deadline: float | None = None,
              sign: Callable[[], dict[str, str]] | None = None) -> None:
    """GET url into tmp, hashing every chunk as it is written; a dropped stream resumes with a Range request.

    With `deadline` (time.monotonic()), the whole transfer must end by then: chunks are taken as they arrive, so a
    sender that trickles a byte at a time, which a per-read timeout never catches, is cut off (PeerFault).
    `sign` adds headers made afresh for every attempt (a peer request's nonce is good for one request only).
    """
    chunk_size = CHUNK if deadline is None else None
    h = e.hasher()
    done = 0
    with open(tmp, "wb") as fh:
        for attempt in range(1, attempts + 1):
            hdrs = dict(headers)
            if sign is not None:
                hdrs.update(sign())
            if done:
                hdrs["Range"] = f"bytes={done}-"
            try:
                with client.stream("GET", url, headers=hdrs) as r:
                    if r.status_code in (401, 403, 404):
                        # The hub refusing a file stops the download; a peer refusing one only costs that peer.
                        raise (Fatal if from_hub else PeerFault)(f"{e.name}: HTTP {r.status_code} from "
                                                                 f"{url.split('?')[0]}")
                    if r.status_code == 200 and done:  # the server ignored the Range: start over
                        fh.seek(0)
                        fh.truncate()
                        h, done = e.hasher(), 0
                    elif r.status_code not in (200, 206):
                        raise httpx2.HTTPStatusError(f"HTTP {r.status_code}", request=r.request, response=r)
                    for chunk in r.iter_bytes(chunk_size):
                        if deadline is not None and time.monotonic() > deadline:
                            raise PeerFault(f"{e.name}: {done:,} of {e.size:,} bytes by the transfer's deadline")
                        fh.write(chunk)
                        h.update(chunk)
                        done += len(chunk)
                        counters.add(e.name, len(chunk), from_hub)
                        if done > e.size:
                            raise Corrupt(f"{e.name}: more than the {e.size:,} bytes the hub records")
                if done == e.size:
                    break
                raise httpx2.RemoteProtocolError(f"{e.name}: stream ended at {done:,} of {e.size:,} bytes")
            except (httpx2.TransportError, httpx2.HTTPStatusError) as exc:
                if attempt == attempts:
                    raise
                log(f"{e.name}: {type(exc).__name__} at {done:,} bytes; resuming (attempt {attempt + 1})")
                time.sleep(min(2**attempt, 30) if from_hub else 0.2)
    if h.hexdigest() != e.etag:
        raise Corrupt(f"{e.name}: hashes to {h.hexdigest()[:16]}... but the hub records {e.etag[:16]}...")


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

    def __init__(self, bind: str, port: int, token: str, node: Node, max_connections: int = 64) -> None:
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


def _handler(token: str, address: str, node: Node) -> type[BaseHTTPRequestHandler]:
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


class Node:
    def __init__(self, args: argparse.Namespace, manifest: list[Entry], cache: Cache, hub_token: str | None) -> None:
        self.args = args
        self.manifest = manifest
        self.by_name = {e.name: e for e in manifest}
        self.sizes = [(e.name, e.size) for e in manifest]
        self.cache = cache
        self.counters = Counters()
        self.lock = threading.Lock()
        self.done: set[str] = set()
        self.peers_spec = [p for p in args.peers.split(",") if p] if args.peers else []
        self.n = max(1, len(self.peers_spec))
        self.hub_headers = build_hf_headers(token=hub_token)
        transport = httpx2.HTTPTransport(local_address=args.source_address) if args.source_address else None
        # The hub redirects file bodies to its CDN; httpx2 drops the Authorization header when the host changes.
        self.hub = httpx2.Client(follow_redirects=True, transport=transport,
                                 timeout=httpx2.Timeout(30.0, read=args.stall_seconds))
        self.peer_client = httpx2.Client(timeout=httpx2.Timeout(5.0, read=args.stall_seconds))
        self.peer_token = read_secret(args.peer_token_file)
        now = time.monotonic()
        self.peers = {r: Peer(r, peer_url(spec), now) for r, spec in enumerate(self.peers_spec) if r != args.rank}
        self.corrupt: dict[str, int] = {}
        self.peer_failures: dict[str, int] = {}
        self.hub_only: set[str] = set()

    def peer_auth(self, p: Peer, path: str) -> dict[str, str]:
        """Headers for one GET of `path` from peer p: signed with the token for p's address, a new nonce each time."""
        if not self.peer_token:
            return {}
        return {"Authorization": peer_authorization(self.peer_token, "GET", p.url.removeprefix("http://"), path)}

    # what peers see
    def done_snapshot(self) -> set[str]:
        with self.lock:
            return set(self.done)

    def bytes_done(self) -> int:
        with self.lock:
            verified = sum(self.by_name[n].size for n in self.done)
        with self.counters.lock:
            return verified + sum(self.counters.inflight.values())

    def status(self) -> dict[str, Any]:
        done = self.done_snapshot()
        return {"rank": self.args.rank, "revision": self.args.revision, "done": sorted(done),
                "complete": len(done) == len(self.manifest), "bytes_done": self.bytes_done()}

    def write_progress(self) -> None:
        done = self.done_snapshot()
        write_json(self.args.progress_file, {
            "bytes_done": self.bytes_done(), "bytes_total": sum(e.size for e in self.manifest),
            "files_done": len(done), "files_total": len(self.manifest), "updated_at": time.time(),
            "hub_bytes": self.counters.hub, "peer_bytes": self.counters.peer, "revision": self.args.revision,
            "metadata_done": all(e.name in done for e in self.manifest if not is_shard(e.name)),
        })

    # peers
    def peer_status(self, p: Peer) -> dict[str, Any]:
        """A peer's GET /status, read up to a size cap and checked field by field (PeerFault if out of shape)."""
        deadline = time.monotonic() + PEER_STATUS_DEADLINE_S  # the whole answer, so a trickle cannot hold the loop
        with self.peer_client.stream("GET", f"{p.url}/status", headers=self.peer_auth(p, "/status"),
                                     timeout=2.0) as r:
            r.raise_for_status()
            body = b""
            for chunk in r.iter_bytes():
                body += chunk
                if len(body) > PEER_STATUS_MAX_BYTES:
                    raise PeerFault(f"its /status answer is over {PEER_STATUS_MAX_BYTES:,} bytes")
                if time.monotonic() > deadline:
                    raise PeerFault(f"its /status answer took over {PEER_STATUS_DEADLINE_S:g} s")
        return parse_status(body, self.args.revision, self.by_name)

    def poll_peers(self) -> None:
        now = time.monotonic()
        own = self.owner_map()
        for p in self.peers.values():
            if p.dead:
                continue  # given up on: its files come from the hub, and what it says no longer counts
            try:
                st = self.peer_status(p)
            except PeerFault as exc:
                p.reachable = False
                self.declare_dead(p, f"answered out of shape ({exc})")
                continue
            except (httpx2.HTTPError, ValueError) as exc:
                p.reachable = False
                p.why = f"{type(exc).__name__}: {exc}"[:200]
                since = p.last_ok if p.last_ok is not None else p.first_try
                if not p.dead and not p.complete and now - since > self.args.peer_timeout:
                    self.declare_dead(p, f"unreachable for {self.args.peer_timeout:.0f} s ({p.why})")
                continue
            p.reachable, p.last_ok = True, now
            p.done = set(st["done"])
            p.complete = p.complete or st["complete"]
            if st["bytes_done"] != p.bytes_done:
                p.bytes_done, p.progress_at = st["bytes_done"], now
            elif (not p.dead and now - p.progress_at > self.args.stall_seconds
                  and any(r == p.rank and f not in p.done for f, r in own.items())):
                # Only a peer with files of its own still to fetch can stall: one that waits for others cannot.
                self.declare_dead(p, f"no progress for {self.args.stall_seconds:.0f} s")

    def declare_dead(self, p: Peer, why: str) -> None:
        p.dead = True
        log(f"peer {p.rank} ({p.url}) {why}: its files go to the other nodes, which take them from the hub")

    def owner_map(self) -> dict[str, int]:
        return owners(self.sizes, self.n, {p.rank for p in self.peers.values() if p.dead})

    # one file
    def fetch(self, e: Entry, source: Peer | None) -> None:
        tmp = self.cache.blob(e) + ".incomplete"
        try:
            if source is None:
                url = hf_hub_url(self.args.repo, e.name, revision=self.args.revision, endpoint=self.args.endpoint)
                stream_to(self.hub, url, self.hub_headers, e, tmp, self.counters, True, HUB_ATTEMPTS)
            else:
                path = f"/files/{quote(e.name)}"
                url = source.url + path
                # The whole transfer has a deadline: a peer's own byte count cannot vouch for its speed.
                deadline = time.monotonic() + e.size / self.args.peer_min_rate + self.args.stall_seconds
                stream_to(self.peer_client, url, {}, e, tmp, self.counters, False, 2, deadline,
                          sign=lambda: self.peer_auth(source, path))
            self.cache.commit(e, tmp)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
        finally:
            self.counters.drop(e.name)
        with self.lock:
            self.done.add(e.name)

    # the whole run
    def run(self) -> None:
        for e in self.manifest:
            if self.cache.is_verified(e):
                self.done.add(e.name)
        kept = len(self.done)
        if kept:
            log(f"kept {kept} of {len(self.manifest)} files verified on an earlier run")
        total = sum(e.size for e in self.manifest)
        log(f"{len(self.manifest)} files, {total / 1e9:,.2f} GB; node {self.args.rank} of {self.n}"
            + (f", sharing with {len(self.peers)} peers" if self.peers else ", every file from the hub"))
        server = None
        if self.peers and (len(self.done) < len(self.manifest) or self.args.serve_complete):
            if not self.peer_token:
                raise Fatal("peers given but no peer token (--peer-token-file)")
            bind = self.peers_spec[self.args.rank].rpartition(":")[0] or self.peers_spec[self.args.rank]
            bind_port = int(peer_url(self.peers_spec[self.args.rank]).rsplit(":", 1)[1])
            cap = len(self.peers) * (self.args.workers + 2) + PEER_EXTRA_CONNECTIONS
            server = Server(bind, bind_port, self.peer_token, self, max_connections=cap)
            server.start()
            log(f"serving finished files to the peers on {bind}:{bind_port} (private network only)")
        try:
            self._loop()
        finally:
            if server is not None:
                server.stop()
                log("peer server stopped; nothing is listening any more")
            self.hub.close()
            self.peer_client.close()
            self.write_progress()

    def _loop(self) -> None:
        inflight: dict[Future[None], tuple[Entry, Peer | None]] = {}
        names_inflight: set[str] = set()
        pool = ThreadPoolExecutor(max_workers=2 * self.args.workers)
        try:
            self._schedule(pool, inflight, names_inflight)
        finally:
            # On a failure, do not wait for the other streams: the process exits and the files stay .incomplete.
            pool.shutdown(wait=False, cancel_futures=True)

    def _schedule(self, pool: ThreadPoolExecutor, inflight: dict[Future[None], tuple[Entry, Peer | None]],
                  names_inflight: set[str]) -> None:
        a = self.args
        last_report = 0.0
        recorded_complete = False
        while True:
            self.poll_peers()
            own = self.owner_map()
            hub_n = sum(1 for _, src in inflight.values() if src is None)
            peer_n = len(inflight) - hub_n
            # The metadata first (the kernel warm-up waits for it), then the biggest shards first.
            todo = sorted((e for e in self.manifest if e.name not in self.done and e.name not in names_inflight),
                          key=lambda e: (is_shard(e.name), -e.size, e.name))
            for e in todo:
                holders = [p for p in self.peers.values() if p.reachable and not p.dead and e.name in p.done]
                holders.sort(key=lambda p: (p.rank != own[e.name], p.rank))
                if holders and e.name not in self.hub_only:
                    if peer_n < a.workers:
                        inflight[pool.submit(self.fetch, e, holders[0])] = (e, holders[0])
                        names_inflight.add(e.name)
                        peer_n += 1
                elif own[e.name] == a.rank or e.name in self.hub_only or self._nobody_else(own[e.name]):
                    if hub_n < a.workers and (e.name in self.hub_only or self._peers_seen()):
                        inflight[pool.submit(self.fetch, e, None)] = (e, None)
                        names_inflight.add(e.name)
                        hub_n += 1
            finished, _ = wait(list(inflight), timeout=a.poll_seconds, return_when=FIRST_COMPLETED) \
                if inflight else (set(), None)
            for fut in finished:
                e, src = inflight.pop(fut)
                names_inflight.discard(e.name)
                self._settle(fut, e, src)
            self.write_progress()
            now = time.monotonic()
            if now - last_report >= a.report_seconds:
                self._report()
                last_report = now
            if len(self.done) == len(self.manifest):
                if not recorded_complete:
                    self.cache.finish(self.manifest)
                    recorded_complete = True
                    self._report()
                    log(f"all {len(self.manifest)} files verified")
                # Keep serving until every peer has everything, was given up on, or went away after it was seen
                # (one that has not answered yet may still be starting: it is waited for up to --peer-timeout).
                if all(p.complete or p.dead or (p.last_ok is not None and not p.reachable)
                       for p in self.peers.values()):
                    if a.serve_complete:
                        # Stay up a few polls more so that a peer serving with --serve-complete sees this node
                        # complete; otherwise it never saw it and waits out --peer-timeout for it.
                        time.sleep(max(5.0, 3 * a.poll_seconds))
                    return
            if not inflight:
                time.sleep(a.poll_seconds)

    def _peers_seen(self) -> bool:
        """With --serve-complete (replicas), nothing comes from the hub until every peer has answered once or was
        given up on: a peer may already hold every file (a re-created replica's twin), and it must get the chance
        to say so before this node downloads its own share again. Bounded by --peer-timeout."""
        return not self.args.serve_complete or all(p.last_ok is not None or p.dead for p in self.peers.values())

    def _nobody_else(self, owner: int) -> bool:
        p = self.peers.get(owner)
        return p is None or p.dead

    def _settle(self, fut: Future[None], e: Entry, src: Peer | None) -> None:
        exc = fut.exception()
        if exc is None:
            return
        where = "the hub" if src is None else f"peer {src.rank}"
        if isinstance(exc, Corrupt):
            self.corrupt[e.name] = self.corrupt.get(e.name, 0) + 1
            if self.corrupt[e.name] > 1:
                raise Fatal(f"{e.name} failed its hash twice (last from {where}): {exc}")
            log(f"CORRUPT from {where}: {exc}; deleted, fetching it again from the hub")
            self.hub_only.add(e.name)
        elif isinstance(exc, Fatal):
            raise exc
        elif src is not None and isinstance(exc, PeerFault):
            self.hub_only.add(e.name)
            if not src.dead:
                self.declare_dead(src, f"was too slow: {exc}")
            src.reachable = False
        elif src is None:
            raise Fatal(f"{e.name}: the hub download failed after {HUB_ATTEMPTS} attempts: {type(exc).__name__}: {exc}")
        else:
            self.peer_failures[e.name] = self.peer_failures.get(e.name, 0) + 1
            if self.peer_failures[e.name] >= 3:
                self.hub_only.add(e.name)
            log(f"{e.name} from peer {src.rank} failed ({type(exc).__name__}: {exc}); trying again"
                + (" from the hub" if e.name in self.hub_only else ""))
            src.reachable = False

    def _report(self) -> None:
        done = self.bytes_done()
        total = sum(e.size for e in self.manifest)
        log(f"weights: {done / 1e9:,.2f} of {total / 1e9:,.2f} GB, {len(self.done)}/{len(self.manifest)} files "
            f"verified; from the hub {self.counters.hub / 1e9:,.2f} GB, from peers {self.counters.peer / 1e9:,.2f} GB")


def record_result(path: str | None, line: str) -> None:
    if path:
        with open(path + ".tmp", "w", encoding="utf-8") as fh:
            fh.write(line + "\n")
        os.replace(path + ".tmp", path)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cache = Cache(args.cache_dir, args.repo, args.revision, args.record)
    try:
        recorded = cache.recorded_manifest()
        complete = recorded is not None and all(cache.is_verified(e) for e in recorded)
        if complete and recorded is not None and args.serve_complete and args.peers:
            # The record is this revision's manifest: serve every file to the peers, and ask the hub nothing.
            log(f"all {len(recorded)} files were verified on an earlier run; serving them until every peer has them")
            Node(args, recorded, cache, None).run()
            record_result(args.result_file, f"ok {args.revision}")
            return 0
        if complete and recorded is not None:
            # A finished download of this revision, unchanged since: nothing to ask the hub or the peers.
            log(f"all {len(recorded)} files of {args.repo}@{args.revision} were verified on an earlier run and are "
                "unchanged; nothing to fetch")
            total = sum(e.size for e in recorded)
            write_json(args.progress_file, {"bytes_done": total, "bytes_total": total, "files_done": len(recorded),
                                            "files_total": len(recorded), "updated_at": time.time(),
                                            "hub_bytes": 0, "peer_bytes": 0})
            record_result(args.result_file, f"ok {args.revision}")
            return 0
        token = read_secret(args.token_file)
        log(f"reading the manifest of {args.repo}@{args.revision} from the hub")
        node = Node(args, hub_manifest(args, token), cache, token)
        node.run()
    except Exception as exc:  # noqa: BLE001 - reported by the poller; messages name files and URLs, never a token
        reason = f"{type(exc).__name__}: {exc}".replace("\n", " ")[:2000]
        log(f"download failed: {reason}")
        record_result(args.result_file, f"failed {args.revision} {reason}")
        sys.stdout.flush()
        os._exit(1)  # without joining streams that are still running: their files stay .incomplete
    record_result(args.result_file, f"ok {args.revision}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
