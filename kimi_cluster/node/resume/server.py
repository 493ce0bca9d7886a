"""The resuming layer's HTTP server and command line: `python3 -m kimi_cluster.node.resume ...` on the front.

It listens on the front's loopback only (Caddy, beside it, holds TLS and the key check and hands it
`POST /v1/chat/completions`), answers `GET /health` for itself, and runs until SIGTERM. Then it hands over: it closes
its listener at once (a new layer can take the port, and Caddy dials that one), serves every connection it already
took to its end, up to `--drain-s`, and exits 0. So a change of its program or flags cuts no stream
(kimi_cluster/plan/templates/resume.sh.j2 starts the new one beside the draining one).

Each connection is one client's and stays that client's trouble (intake.py): its request line, headers and body must
all come within `--client-timeout-s` of the connection, however slowly they trickle (408 if they do not); the body
by a Content-Length or chunks that must be numbers (400 naming the header otherwise), and up to `--max-body-bytes`
(413); every write to it must go through within the same timeout, so a client that stops reading ends its own
request (and its generation) instead of holding this layer. Anything unexpected is a 500 with a one-line message,
and one line in the log, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import selectors
import signal
import socket
import sys
import threading
from collections.abc import Sequence
from typing import Any

from . import chat, wire
from .generation import Limits
from .intake import CLIENT_TIMEOUT_S, MAX_BODY, BoundedHandler, BoundedServer
from .pool import Pool, log
from .render import RenderServers
from .request import BadRequest

# How long a layer told to stop goes on serving the requests it took: an agent's turn can stream for minutes. The
# front's step gives the unit this and a margin before systemd kills it (kimi_cluster/plan/resume.py).
DRAIN_S = 600.0


class Server(BoundedServer):
    allow_reuse_address = True
    front: chat.Front

    def server_activate(self) -> None:
        super().server_activate()
        self.in_flight = 0  # connections taken and not yet answered to their end
        self.settled = threading.Condition()
        self.stopping = False
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_w.setblocking(False)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self.settled:  # counted before its thread starts: a drain never misses one
            self.in_flight += 1
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._done()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._done()

    def _done(self) -> None:
        with self.settled:
            self.in_flight -= 1
            self.settled.notify_all()

    def stop(self) -> None:
        """Asks serve() to stop taking connections (safe in a signal handler: a flag and one byte)."""
        self.stopping = True
        try:
            self._wake_w.send(b"x")
        except OSError:  # already woken
            pass

    def serve(self) -> None:
        """Accepts until stop(); then takes what the kernel already queued and closes the listener, at once (no
        poll interval): from then on a connect is refused, and the front's Caddy dials the next layer."""
        with selectors.DefaultSelector() as selector:
            selector.register(self.socket, selectors.EVENT_READ)
            selector.register(self._wake_r, selectors.EVENT_READ)
            while not self.stopping:
                for key, _ in selector.select():
                    if key.fileobj is self.socket and not self.stopping:
                        self._take()
        # A connection the kernel completed before the close is a request Caddy already sent: served, not reset.
        self.socket.setblocking(False)
        while True:
            try:
                request, address = self.socket.accept()
            except OSError:
                break
            request.setblocking(True)
            try:
                self.process_request(request, address)
            except Exception:  # noqa: BLE001  # as in _take
                self.shutdown_request(request)
        self.server_close()

    def _take(self) -> None:
        """Accepts one connection and hands it to its thread (as socketserver's own loop does)."""
        try:
            request, address = self.get_request()
        except OSError:
            return
        try:
            self.process_request(request, address)
        except Exception:  # noqa: BLE001  # a thread that cannot start: that connection is closed, the server goes on
            self.shutdown_request(request)

    def drain(self, bound_s: float) -> int:
        """Waits until every connection taken is answered, at most bound_s; returns how many were still going."""
        with self.settled:
            self.settled.wait_for(lambda: self.in_flight == 0, timeout=bound_s)
            return self.in_flight


class Handler(BoundedHandler):
    """One client's request (intake.py bounds it), answered by chat.handle; the relay.Client it streams to."""

    server: Server

    # ---- relay.Client

    def start_stream(self) -> None:
        self.answered = True
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
        self.read_deadline.cancel()  # a GET has no body: all of it has come
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
        try:
            chat.handle(self.server.front, path, self.body(), self)
        except BadRequest as exc:
            if not self.answered:
                self.whole(exc.status, exc.body())
        except TimeoutError:
            if not self.answered:
                log(f"a client's body did not arrive within {self.server.client_timeout_s:g} s")
                self.last_word(408, f"the request body did not arrive within {self.server.client_timeout_s:g} s")
            else:
                log(f"a client read nothing for {self.server.client_timeout_s:g} s: its request is ended")
            self.close_connection = True
        except OSError:
            self.close_connection = True  # the client went away: its generation closed with the request
        except Exception as exc:  # noqa: BLE001  # the last word: one line for the log, a short 500 for the client
            log(f"{path}: unexpected {type(exc).__name__}: {exc}")
            self.last_word(500, f"the resuming layer failed on this request ({type(exc).__name__})")
            self.close_connection = True


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python3 -m kimi_cluster.node.resume", description=__doc__.splitlines()[0])
    ap.add_argument("--listen", default="127.0.0.1:8100", help="HOST:PORT to serve on (the front's loopback)")
    ap.add_argument("--render", action="append", required=True,
                    help="vLLM's render server (or, with --engine sglang, SGLang's chat layer: "
                         "kimi_cluster/node/sglang_chat.py), http://HOST:PORT; twice for the two ports a new one "
                         "starts on beside the old (the one that answered last is called first)")
    ap.add_argument("--engine", choices=("vllm", "sglang"), default="vllm",
                    help="the replicas' engine: which token door they serve and which chat layer --render is")
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
    ap.add_argument("--max-body-bytes", type=int, default=MAX_BODY, help="the largest request body taken (413 past it)")
    ap.add_argument("--client-timeout-s", type=float, default=CLIENT_TIMEOUT_S,
                    help="a client's whole request must arrive, and each write to it go through, within this "
                         "(408 / ended)")
    ap.add_argument("--drain-s", type=float, default=DRAIN_S,
                    help="after SIGTERM (its listener closed at once), how long the requests it took may go on")
    args = ap.parse_args(argv)
    if bool(args.replica) == bool(args.replicas_file):
        ap.error("give the replicas with --replica or with --replicas-file (one of them)")
    if not 0 < args.max_body_bytes <= 1 << 30:
        ap.error("--max-body-bytes must be more than 0 and at most 1 GiB")
    if not 0 <= args.drain_s <= 86400:
        ap.error("--drain-s must be between 0 and 86400")
    for name in ("silence_s", "tick_s", "pick_s", "health_interval_s", "health_timeout_s", "client_timeout_s"):
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
    server.max_body, server.client_timeout_s = args.max_body_bytes, args.client_timeout_s
    server.front = chat.Front(pool, RenderServers([wire.address(url) for url in args.render]),
                              Limits(args.silence_s, args.tick_s, args.pick_s, args.resumes), engine=args.engine)
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
    signal.signal(signal.SIGTERM, lambda *_: server.stop())
    log(f"serving on {args.listen}: {len(server.front.pool.urls())} replicas, render servers {server.front.render}")
    server.serve()
    log(f"stopping: the listener is closed; {server.in_flight} requests in flight may finish within "
        f"{args.drain_s:g} s")
    left = server.drain(args.drain_s)
    if left:
        log(f"{left} requests still going after {args.drain_s:g} s: they end with this process")
    else:
        log("every request taken was answered: exiting")
    server.front.pool.stop.set()
    return 0


if __name__ == "__main__":
    sys.exit(main())
