"""The resuming layer's HTTP server and command line: `python3 -m kimi_cluster.node.resume ...` on the front.

It listens on the front's loopback only (Caddy, beside it, holds TLS and the key check and hands it
`POST /v1/chat/completions`), answers `GET /health` for itself, and runs until SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from . import chat, wire
from .generation import Limits
from .pool import Pool, log
from .render import RenderServers

MAX_BODY = 64 * 1024 * 1024  # as the front's Caddy buffers at most (request_buffers), and vLLM's own limit is larger


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    front: chat.Front


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Server

    def log_message(self, fmt: str, *args: Any) -> None:  # Caddy logs the requests; this logs only what it does
        pass

    # ---- chat.Client

    def whole(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)

    def start_stream(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Connection", "close")
        self.end_headers()

    def write(self, data: bytes) -> None:
        if data:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()

    def end(self) -> None:
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    # ---- routes

    def do_GET(self) -> None:
        if self.path.split("?", 1)[0] == "/health":
            # The replicas it balances over (the front's step waits until a new list shows here), and the
            # generations running on each.
            pool = self.server.front.pool
            return self.whole(200, json.dumps({"replicas": pool.urls(), "generating": pool.generations()}).encode())
        self.whole(404, b'{"detail":"Not Found"}')

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0]
        if path not in chat.ROUTES:
            return self.whole(404, b'{"detail":"Not Found"}')
        raw = self._body()
        if raw is None:
            return self.whole(413, b'{"detail":"request body too large"}')
        try:
            chat.handle(self.server.front, path, raw, self)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client went away; the upstream's socket closed with the generation, which aborts it


    def _body(self) -> bytes | None:
        """The request's body, by its length or its chunks (None past MAX_BODY)."""
        if "chunked" not in self.headers.get("Transfer-Encoding", "").lower():
            length = int(self.headers.get("Content-Length") or 0)
            return self.rfile.read(length) if 0 <= length <= MAX_BODY else None
        body = b""
        while True:
            size = int(self.rfile.readline(1024).split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while self.rfile.readline(1024) not in (b"\r\n", b"\n", b""):
                    pass  # trailers
                return body
            if len(body) + size > MAX_BODY:
                return None
            body += self.rfile.read(size)
            self.rfile.readline(1024)


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python3 -m kimi_cluster.node.resume", description=__doc__.splitlines()[0])
    ap.add_argument("--listen", default="127.0.0.1:8100", help="HOST:PORT to serve on (the front's loopback)")
    ap.add_argument("--render", action="append", required=True,
                    help="vLLM's render server, http://HOST:PORT; twice for the two ports a new one starts on "
                         "beside the old (the one that answered last is called first)")
    ap.add_argument("--replica", action="append", default=[], help="a replica's engine, http://HOST:PORT")
    ap.add_argument("--replicas-file", help="a file of replica URLs, one a line, read again whenever it changes "
                    "(a replica re-created at a new address), so the list changes with no restart")
    limits = Limits()
    ap.add_argument("--silence-s", type=float, default=limits.silence_s,
                    help="silence after which a stream whose replica fails its health check is resumed elsewhere")
    ap.add_argument("--tick-s", type=float, default=limits.tick_s, help="keep-alive interval while a stream waits")
    ap.add_argument("--pick-s", type=float, default=limits.pick_s, help="how long to wait for a healthy replica")
    ap.add_argument("--resumes", type=int, default=limits.resumes, help="losses one request survives")
    ap.add_argument("--health-interval-s", type=float, default=1.0)
    ap.add_argument("--health-timeout-s", type=float, default=1.0)
    ap.add_argument("--health-fails", type=int, default=2)
    ap.add_argument("--health-passes", type=int, default=2)
    args = ap.parse_args(argv)
    if bool(args.replica) == bool(args.replicas_file):
        ap.error("give the replicas with --replica or with --replicas-file (one of them)")
    for name in ("silence_s", "tick_s", "pick_s", "health_interval_s", "health_timeout_s"):
        if not 0 < getattr(args, name) <= 3600:
            ap.error(f"--{name.replace('_', '-')} must be more than 0 and at most 3600")
    for name in ("resumes", "health_fails", "health_passes"):
        if not 0 <= getattr(args, name) <= 100:
            ap.error(f"--{name.replace('_', '-')} must be between 0 and 100")
    return args


def read_replicas(path: str) -> list[str]:
    """The replica URLs of a --replicas-file, each checked as --replica's are."""
    with open(path, encoding="utf-8") as handle:
        urls = [line.strip() for line in handle if line.strip() and not line.startswith("#")]
    for url in urls:
        wire.address(url)
    if not urls:
        raise ValueError(f"{path} names no replica")
    return urls


def follow(pool: Pool, path: str, interval_s: float) -> None:
    """Read the replicas file again every interval_s; a new list goes to the pool (one that cannot be read is
    logged and the old list kept: the step writes the file whole, by a rename)."""
    last = pool.urls()
    while not pool.stop.wait(interval_s):
        try:
            urls = read_replicas(path)
        except (OSError, ValueError) as exc:
            log(f"the replicas file cannot be read ({exc}); keeping {', '.join(last)}")
            continue
        if urls != last:
            pool.set_urls(urls)
            last = urls


def build(args: argparse.Namespace) -> Server:
    urls = read_replicas(args.replicas_file) if args.replicas_file else args.replica
    pool = Pool(urls, args.health_interval_s, args.health_timeout_s, args.health_fails, args.health_passes)
    host, port = wire.address("http://" + args.listen)
    server = Server((host, port), Handler)
    server.front = chat.Front(pool, RenderServers([wire.address(url) for url in args.render]),
                              Limits(args.silence_s, args.tick_s, args.pick_s, args.resumes))
    return server


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = parse(argv)
        server = build(args)
    except (ValueError, OSError) as exc:
        print(f"kimi-resume: {exc}", file=sys.stderr)
        return 2
    server.front.pool.start()
    if args.replicas_file:
        threading.Thread(target=follow, args=(server.front.pool, args.replicas_file, args.health_interval_s),
                         name="replicas file", daemon=True).start()
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown, daemon=True).start())
    log(f"serving on {args.listen}: {len(server.front.pool.urls())} replicas, render servers {server.front.render}")
    server.serve_forever(poll_interval=0.5)
    server.front.pool.stop.set()
    return 0


if __name__ == "__main__":
    sys.exit(main())
