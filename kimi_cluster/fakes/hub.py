"""A local stand-in for the Hugging Face Hub: one tiny repository at a pinned revision, served over loopback HTTP.

The real huggingface_hub (snapshot_download, HfApi.model_info) works against it through HF_ENDPOINT, with the hub's
headers and redirects (LFS files go through a "CDN" on the other loopback name, as on the real hub) and no Xet; knobs
inject the faults a node must survive: a private repo, a missing repo, a file served short, a dropped connection.
For the weights benchmark it also caps the bandwidth per client address (a hub serves each client at a bounded
rate), serves a synthetic repository of any size, and logs every answer as one JSON line; a test holds every body
at its middle and releases it (kimi_cluster/fakes/hub_hold.py: `--hold`, POST HOLD_PATH, POST RELEASE_PATH).

    python -m kimi_cluster.fakes.hub --port 8123 --repo moonshotai/Kimi-K3.1-Pro --revision
    6d0a0202956796543364d666ab19c6ad1a494ee1
    python -m kimi_cluster.fakes.hub --shards 96 --shard-bytes 1000000 --client-bytes-per-second 4e6 --log-file
    hub.jsonl
"""

from __future__ import annotations

import argparse
import json
import re
import ssl
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

from kimi_cluster.fakes.hub_edges import ClientPace, ConnectionPace, Edges
from kimi_cluster.fakes.hub_hold import HOLD_PATH, RELEASE_PATH, Hold, pieces
from kimi_cluster.fakes.hub_repo import (
    LFS_POINTER_SIZE,
    HubFile,
    chat_model_files,
    safetensors_bytes,
    synthetic_repo,
    tiny_repo,
)

# The repository's files live in kimi_cluster/fakes/hub_repo.py; their names stay importable from here.
__all__ = ["HOLD_PATH", "LFS_POINTER_SIZE", "RELEASE_PATH", "STATS_PATH", "Edges", "FakeHub", "Faults", "HubFile",
           "main", "safetensors_bytes", "synthetic_repo", "tiny_repo"]


@dataclass
class Faults:
    """What to break. Counts go down as requests use them up."""

    private: bool = False  # 401 without `Authorization: Bearer <token>`
    missing_repo: bool = False  # 404 RepoNotFound everywhere
    short: Counter = field(default_factory=Counter)  # path -> times to send a consistent but shorter body
    drop: Counter = field(default_factory=Counter)  # path -> times to cut the connection mid-body (client resumes)
    corrupt: Counter = field(default_factory=Counter)  # path -> times to flip one byte in the middle of the body
    bytes_per_second: float | None = None  # throttle file bodies, to interrupt a download midway
    client_bytes_per_second: float | None = None  # cap on all bodies to one client address, across its connections
    edges: Edges | None = None  # a CDN's edges: a cap per connection, fast or slow, drawn per request


class _QuietServer(ThreadingHTTPServer):
    """A client that goes away mid-answer (a killed node) is routine here, not a traceback on stderr."""

    # socketserver's backlog is 5: past it, a new connection's handshake is left half-done and its first request
    # waits 1 to 15 s for the SYN-ACK to be sent again (seen as ReadTimeouts by 4 benchmark nodes re-opening streams
    # at once). A CDN accepts whatever connects; the queue holds as many as the fake's callers open at once.
    request_queue_size = 1024

    def handle_error(self, request, client_address) -> None:
        import sys

        if not isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            super().handle_error(request, client_address)


class FakeHub:
    """Threaded HTTP server; use as a context manager or start()/stop(). `url` is the HF_ENDPOINT to use."""

    def __init__(self, repo: str, revision: str, files: list[HubFile] | None = None, *, token: str | None = None,
                 faults: Faults | None = None, host: str = "127.0.0.1", port: int = 0,
                 log_file: str | None = None, cdn_host: str | None = None,
                 tls: tuple[str, str] | None = None) -> None:
        self.repo, self.revision = repo, revision
        # The name the LFS redirects send clients to; None: the other loopback name of the one they asked.
        self.cdn_host = cdn_host
        self.files = {f.path: f for f in (files if files is not None else tiny_repo())}
        self.token = token
        self.faults = faults or Faults()
        self.requests: list[tuple[str, str, str]] = []  # (method, path, range header)
        self.body_bytes = 0  # file bytes sent (GET bodies), for tests proving a re-run downloads nothing
        self.body_bytes_by_client: Counter = Counter()  # the same, per client address
        self.lock = threading.Lock()
        self.log_file = log_file
        self.sent: Counter = Counter()  # client address -> body bytes sent
        self.answers: list[tuple[str, str, str, int, int]] = []  # (client, method, path, status, body bytes)
        self.client_pace = ClientPace()
        self.hold = Hold()  # every file body stops at its middle while held (kimi_cluster/fakes/hub_hold.py)
        self.server = _QuietServer((host, port), _handler(self))
        self.server.daemon_threads = True
        # (certificate file, key file): https, as a real mirror on another host serves the token's requests.
        self.scheme = "https" if tls else "http"
        if tls:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(*tls)
            # The handshake runs in each request's thread, not in the accept loop, where a slow client would stall it.
            self.server.socket = context.wrap_socket(self.server.socket, server_side=True,
                                                     do_handshake_on_connect=False)
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return self.server.server_address[1]

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"

    def start(self) -> FakeHub:
        # A second serve_forever on the same server outlives shutdown() (which ends only one) and then spins on the
        # closed socket for the rest of the process: refuse it.
        if self._thread is not None:
            raise RuntimeError("this FakeHub is already started (a `with FakeHub(...)` block starts it)")
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.hold.release()  # a held body's thread would otherwise wait past the server
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> FakeHub:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def downloads(self, path: str) -> int:
        """How many times the body of `path` was served (GETs of the file or its CDN blob; redirects do not count)."""
        f = self.files[path]
        with self.lock:
            return sum(1 for _, m, p, status, _ in self.answers
                       if m == "GET" and status in (200, 206) and (p.endswith("/" + path) or p.endswith(f.sha256)))

    def copies(self, path: str) -> float:
        """How many times over the bytes of `path` were served, by GETs of whole files and of ranges alike."""
        f = self.files[path]
        with self.lock:
            sent = sum(n for _, m, p, status, n in self.answers
                       if m == "GET" and status in (200, 206) and (p.endswith("/" + path) or p.endswith(f.sha256)))
        return sent / len(f.data) if f.data else float(self.downloads(path))

    def answered(self, client: str, method: str, path: str, status: int, nbytes: int) -> None:
        """Count an answer's body bytes per client and, with a log file, append it as one JSON line."""
        with self.lock:
            self.sent[client] += nbytes
            self.answers.append((client, method, path, status, nbytes))
            if self.log_file:
                line = {"t": round(time.time(), 3), "client": client, "method": method, "path": path,
                        "status": status, "bytes": nbytes}
                with open(self.log_file, "a", encoding="utf-8") as fh:
                    fh.write(json.dumps(line) + "\n")

    def take(self, counter: Counter, path: str) -> bool:
        with self.lock:
            if counter[path] > 0:
                counter[path] -= 1
                return True
        return False

    # ---- JSON shapes of the hub API ---------------------------------------------------------------------------

    def model_info(self, blobs: bool) -> dict:
        siblings = []
        for f in self.files.values():
            s: dict = {"rfilename": f.path}
            if blobs:
                s.update(size=len(f.data), blobId=f.git_sha1)
                if f.lfs:
                    s["lfs"] = {"size": len(f.data), "sha256": f.sha256, "pointerSize": LFS_POINTER_SIZE}
            siblings.append(s)
        return {"_id": "fake", "id": self.repo, "modelId": self.repo, "sha": self.revision,
                "private": self.faults.private, "gated": False, "disabled": False, "tags": [], "siblings": siblings,
                "lastModified": "2026-11-04T00:00:00.000Z", "createdAt": "2026-11-04T00:00:00.000Z"}

    def tree(self) -> list[dict]:
        out = []
        for f in self.files.values():
            entry: dict = {"type": "file", "oid": f.git_sha1, "size": len(f.data), "path": f.path}
            if f.lfs:
                entry["lfs"] = {"oid": f.sha256, "size": len(f.data), "pointerSize": LFS_POINTER_SIZE}
            out.append(entry)
        return out


STATS_PATH = "/_fake/stats"


def _handler(hub: FakeHub) -> type[BaseHTTPRequestHandler]:
    api_info = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)(?:/revision/(?P<rev>[^/]+))?$")
    api_tree = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)/tree/(?P<rev>[^/]+)(?:/.*)?$")
    resolve = re.compile(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<path>.+)$")
    cdn = re.compile(r"^/cdn/(?P<sha>[0-9a-f]{64})$")

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "FakeHub/1"
        edge: ConnectionPace | None = None  # this connection's CDN edge (one handler serves one connection)

        def log_message(self, fmt: str, *args) -> None:  # keep test output quiet
            pass

        # ---- plumbing -------------------------------------------------------------------------------------

        def _send(self, status: int, body: bytes = b"", headers: dict | None = None, length: int | None = None) -> None:
            self.send_response(status)
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body) if length is None else length))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)
            hub.answered(self.client_address[0], self.command, urlsplit(self.path).path, status,
                         0 if self.command == "HEAD" else len(body))

        def _json(self, obj, headers: dict | None = None) -> None:
            self._send(200, json.dumps(obj).encode(), {"Content-Type": "application/json", **(headers or {})})

        def _error(self, status: int, code: str, message: str) -> None:
            body = json.dumps({"error": message}).encode()
            self._send(status, body, {"Content-Type": "application/json", "X-Error-Code": code,
                                      "X-Error-Message": message})

        def _authorized(self) -> bool:
            if not hub.faults.private:
                return True
            return self.headers.get("Authorization", "") == f"Bearer {hub.token}"

        def _repo_ok(self, repo: str) -> bool:
            if hub.faults.missing_repo or repo != hub.repo:
                self._error(404, "RepoNotFound", "Repository not found")
                return False
            if not self._authorized():
                # The hub answers a private repo without credentials as if it did not exist.
                self._error(401, "RepoNotFound", "Invalid username or password.")
                return False
            return True

        def _rev_ok(self, rev: str) -> bool:
            if unquote(rev) not in (hub.revision, "main"):
                self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
                return False
            return True

        # ---- routes -------------------------------------------------------------------------------------

        def do_HEAD(self) -> None:
            self.do_GET()

        def do_POST(self) -> None:  # the fake's own controls (kimi_cluster/fakes/hub_hold.py), not hub routes
            control = {HOLD_PATH: hub.hold.hold, RELEASE_PATH: hub.hold.release}.get(urlsplit(self.path).path)
            if control is None:
                self._send(404, b"not a hub route")
                return
            control()
            self._json({"holding": hub.hold.holding})

        def do_GET(self) -> None:
            url = urlsplit(self.path)
            if url.path == STATS_PATH:
                # The fake's own counters (not a hub route): what a test reads of a hub running as a service.
                with hub.lock:
                    stats = {"requests": len(hub.requests), "body_bytes": hub.body_bytes,
                             "body_bytes_by_client": dict(hub.body_bytes_by_client),
                             "holding": hub.hold.holding, "held": hub.hold.waiting}
                self._json(stats)  # outside the lock: answering logs the answer, which takes it
                return
            with hub.lock:
                hub.requests.append((self.command, url.path, self.headers.get("Range", "")))
            if m := api_tree.match(url.path):
                if self._repo_ok(m["repo"]) and self._rev_ok(m["rev"]):
                    self._json(hub.tree())
            elif m := api_info.match(url.path):
                if self._repo_ok(m["repo"]) and (m["rev"] is None or self._rev_ok(m["rev"])):
                    self._json(hub.model_info(blobs="blobs=" in (url.query or "")))
            elif m := resolve.match(url.path):
                if self._repo_ok(m["repo"]) and self._rev_ok(m["rev"]):
                    self._resolve(unquote(m["path"]))
            elif m := cdn.match(url.path):
                f = next((f for f in hub.files.values() if f.lfs and f.sha256 == m["sha"]), None)
                if f is None:
                    self._send(404, b"no such blob")
                else:
                    self._body(f, {"ETag": f'"{f.sha256}"'})
            else:
                self._send(404, b"not a hub route")

        def _resolve(self, path: str) -> None:
            f = hub.files.get(path)
            common = {"X-Repo-Commit": hub.revision}
            if f is None:
                self._send(404, b"", {**common, "X-Error-Code": "EntryNotFound", "X-Error-Message": "Entry not found"})
                return
            if f.lfs:
                # Like the hub: the metadata rides on the redirect, the bytes come from a CDN on another host (here
                # the other loopback name), so the client drops its Authorization header for the download.
                host = self.headers.get("Host", f"127.0.0.1:{hub.port}")
                if hub.cdn_host:
                    cdn_host = f"{hub.cdn_host}:{hub.port}"
                else:
                    cdn_host = f"localhost:{hub.port}" if host.startswith("127.0.0.1") else f"127.0.0.1:{hub.port}"
                self._send(302, b"", {**common, "Location": f"{hub.scheme}://{cdn_host}/cdn/{f.sha256}",
                                      "ETag": f'"{f.git_sha1}"', "X-Linked-Etag": f'"{f.sha256}"',
                                      "X-Linked-Size": str(len(f.data))})
                return
            self._body(f, {**common, "ETag": f'"{f.git_sha1}"'})

        def _body(self, f: HubFile, headers: dict) -> None:
            data, start = f.data, 0
            rng = self.headers.get("Range", "")
            if m := re.match(r"bytes=(\d+)-(\d*)$", rng):
                start = int(m[1])
                end = int(m[2]) if m[2] else len(data) - 1
                headers = {**headers, "Content-Range": f"bytes {start}-{end}/{len(data)}"}
                data = data[start:end + 1]
                status = 206
            else:
                status = 200
            headers = {**headers, "Accept-Ranges": "bytes", "Content-Type": "application/octet-stream"}
            if self.command == "GET" and hub.take(hub.faults.short, f.path):
                # A consistent but short answer: the client's size check must catch it.
                self._send(status, data[: len(data) // 2], headers)
                with hub.lock:
                    hub.body_bytes += len(data) // 2
                    hub.body_bytes_by_client[self.client_address[0]] += len(data) // 2
                return
            if self.command == "HEAD":
                self._send(status, b"", headers, length=len(data))
                return
            drop = hub.take(hub.faults.drop, f.path)
            if hub.take(hub.faults.corrupt, f.path) and data:
                flipped = bytearray(data)
                flipped[len(flipped) // 2] ^= 0x01
                data = bytes(flipped)
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            limit = len(data) // 2 if drop else len(data)
            edges = hub.faults.edges
            if self.edge is None:  # a keep-alive connection stays on the edge its first answer drew
                self.edge = ConnectionPace(edges.draw(self.client_address[0], f.path, rng) if edges else None)
            edge = self.edge
            paced = hub.faults.client_bytes_per_second or edge.rate
            step = 4096 if hub.faults.bytes_per_second else 64 * 1024 if paced else 1 << 20
            if edge.rate:  # a twentieth of a second per write: a client leaving a slow edge wastes little of it
                step = min(step, max(4096, int(edge.rate / 20)))
            client, sent = self.client_address[0], 0
            try:
                for i, end in pieces(limit, step):
                    if i == limit // 2 and i:
                        self.wfile.flush()  # the first half reaches the client while the rest is held
                        hub.hold.at_middle(f.path)
                    chunk = data[i:end]
                    edge.wait(len(chunk))
                    hub.client_pace.wait(client, len(chunk), hub.faults.client_bytes_per_second)
                    self.wfile.write(chunk)
                    sent += len(chunk)
                    with hub.lock:
                        hub.body_bytes += len(chunk)
                        hub.body_bytes_by_client[client] += len(chunk)
                    if hub.faults.bytes_per_second:
                        self.wfile.flush()
                        time.sleep(step / hub.faults.bytes_per_second)
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True  # the client went away (a killed download): nothing to answer
                return
            finally:
                hub.answered(client, self.command, urlsplit(self.path).path, status, sent)
            if drop:
                self.wfile.flush()
                self.close_connection = True

    return Handler


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="Serve a tiny fake Hugging Face repository on loopback.")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--repo", default="moonshotai/Kimi-K3.1-Pro")
    ap.add_argument("--revision", default="6d0a0202956796543364d666ab19c6ad1a494ee1")
    ap.add_argument("--shards", type=int, default=3)
    ap.add_argument("--token", help="make the repository private: only this Bearer token may read it")
    ap.add_argument("--token-file", help="as --token, read from this file (a command line shows in ps)")
    ap.add_argument("--missing-repo", action="store_true", help="answer 404 RepoNotFound for everything")
    ap.add_argument("--bytes-per-second", type=float, help="throttle file bodies, per connection")
    ap.add_argument("--client-bytes-per-second", type=float, help="cap all bodies sent to one client address")
    ap.add_argument("--edge-bytes-per-second", type=float,
                    help="a CDN's fast edges: cap each connection at this rate (see --slow-edges)")
    ap.add_argument("--slow-edges", type=float, default=0.0, metavar="SHARE",
                    help="the share of requests (0 to 1) that land on a slow edge, capped at --slow-edge-factor of "
                         "--edge-bytes-per-second, drawn per request from --edge-seed (xet-core#821: 0.65-0.75)")
    ap.add_argument("--slow-edge-factor", type=float, default=1 / 8, help="a slow edge's cap over a fast one's")
    ap.add_argument("--edge-seed", type=int, default=0)
    ap.add_argument("--shard-bytes", type=int, help="serve a synthetic repository with shards of this many bytes")
    ap.add_argument("--chat-model", action="store_true",
                    help="serve the tiny chat model's config, tokenizer and chat template beside the weights "
                         "(kimi_cluster/fakes/tiny_model.py), which a front's vLLM render server reads")
    ap.add_argument("--hold", nargs="?", const="*", metavar="GLOB",
                    help=f"start held: every file body (or those whose path matches GLOB) stops at its middle until "
                         f"a POST to {RELEASE_PATH} (POST {HOLD_PATH} holds every one again)")
    ap.add_argument("--log-file", help="append one JSON line per answer: path, status, bytes sent, client address")
    ap.add_argument("--tls-cert", help="serve https with this certificate (PEM; with --tls-key)")
    ap.add_argument("--tls-key", help="the certificate's private key (PEM)")
    ap.add_argument("--cdn-host", help="the host name LFS downloads are redirected to, one that resolves to --host "
                                       "(default: the other loopback name, 127.0.0.1 or localhost)")
    args = ap.parse_args(argv)
    token = args.token
    if args.token_file:
        with open(args.token_file, encoding="utf-8") as fh:
            token = fh.read().strip()
        if not token:
            ap.error(f"--token-file {args.token_file} is empty")
    try:
        edges = Edges(args.slow_edges, args.slow_edge_factor, args.edge_bytes_per_second, args.edge_seed) \
            if args.edge_bytes_per_second or args.slow_edges else None
    except ValueError as exc:
        ap.error(str(exc))
    faults = Faults(private=token is not None, missing_repo=args.missing_repo, edges=edges,
                    bytes_per_second=args.bytes_per_second, client_bytes_per_second=args.client_bytes_per_second)
    files = synthetic_repo(args.shards, args.shard_bytes) if args.shard_bytes else tiny_repo(args.shards)
    if args.chat_model:
        chat = {f.path: f for f in chat_model_files()}
        files = [chat.pop(f.path, f) for f in files] + list(chat.values())
    hub = FakeHub(args.repo, args.revision, files, token=token, faults=faults, host=args.host, port=args.port,
                  log_file=args.log_file, cdn_host=args.cdn_host,
                  tls=(args.tls_cert, args.tls_key) if args.tls_cert and args.tls_key else None)
    if args.hold:
        hub.hold.hold(args.hold)
    print(f"fake hub serving {args.repo}@{args.revision} at {hub.scheme}://{args.host}:{hub.port}", flush=True)
    try:
        hub.server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
