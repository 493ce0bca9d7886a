"""The resuming layer's two render server slots (kimi_cluster/node/resume/render.py): a call goes to the server that
answered last, and on to the other one at once when that one is gone or answers 5xx."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from kimi_cluster.node.resume.render import RenderServers

pytestmark = pytest.mark.integration


@contextmanager
def answering(status: int, name: str) -> Iterator[tuple[tuple[str, int], list[str]]]:
    """A server on loopback answering every POST with `status` and {"by": name}; yields its address and the paths
    it was asked."""
    asked: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            asked.append(self.path)
            body = json.dumps({"by": name}).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield ("127.0.0.1", server.server_address[1]), asked
    finally:
        server.shutdown()
        server.server_close()


def free_address() -> tuple[str, int]:
    """A loopback port nothing listens on (a slot whose container is gone): a connection is refused at once."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return ("127.0.0.1", sock.getsockname()[1])


def test_a_call_goes_on_to_the_other_slot_and_stays_there() -> None:
    gone = free_address()
    with answering(200, "new") as (new, asked):
        servers = RenderServers([gone, new])
        assert servers.call("/render", {}, 5.0)[:2] == (200, {"by": "new"})
        assert servers.call("/derender", {}, 5.0)[:2] == (200, {"by": "new"})
    # The second call went straight to the slot that answered.
    assert asked == ["/render", "/derender"]


def test_a_5xx_tries_the_other_slot_and_a_4xx_is_the_answer() -> None:
    with answering(503, "starting") as (starting, _), answering(400, "old") as (old, asked):
        servers = RenderServers([starting, old])
        assert servers.call("/render", {}, 5.0)[:2] == (400, {"by": "old"})  # the request's own fault: final
        assert asked == ["/render"]


def test_no_slot_answering_is_a_503_saying_why() -> None:
    status, parsed, raw = RenderServers([free_address(), free_address()]).call("/render", {}, 5.0)
    assert (status, parsed) == (503, None) and b"127.0.0.1" in raw
    with answering(502, "broken") as (broken, asked):
        assert RenderServers([free_address(), broken]).call("/render", {}, 5.0)[0] == 502
        assert asked == ["/render"]


def test_at_least_one_slot() -> None:
    with pytest.raises(ValueError, match="at least one"):
        RenderServers([])
