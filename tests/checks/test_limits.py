"""The verifier against hostile servers: a check ends at its total deadline however slowly the
server trickles, an answer is read up to a size cap and no further, and the key is hidden from
every result whatever shape the server or a library gives it.
"""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import quote

import pytest
import requests
from requests.adapters import HTTPAdapter

from kimi_cluster import checks as v
from kimi_cluster.checks.client import MAX_ANSWER_BYTES
from kimi_cluster.checks.deadline import Deadline, use_deadlines
from tests.checks.conftest import KEY, MODEL

pytestmark = pytest.mark.integration  # starts fake nodes, servers or outside tools

# How long a trickling server keeps going: long enough that a per-read timeout never ends the
# check, short enough that a verifier without a total deadline fails the test instead of hanging.
TRICKLE_FOR_S = 8.0
TRICKLE_GAP_S = 0.05


class _HostileServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, mode: str) -> None:
        super().__init__(("127.0.0.1", 0), _Hostile)
        self.mode = mode
        self.log: dict[str, Any] = {}


class _Hostile(BaseHTTPRequestHandler):
    """Answers every GET as the server's `mode` says; records how far it got in `server.log`."""

    protocol_version = "HTTP/1.1"
    server: _HostileServer

    def setup(self) -> None:
        super().setup()
        self.server.log["connections"] = self.server.log.get("connections", 0) + 1

    def do_GET(self) -> None:
        getattr(self, "_" + self.server.mode)()

    def _whole_then_trickle(self) -> None:
        """The first answer whole, on a connection kept alive; every later one trickled."""
        if self.path != "/first":
            return self._trickle_body()
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def _trickle(self, data: bytes) -> None:
        stop = time.monotonic() + TRICKLE_FOR_S
        for i in range(len(data)):
            if time.monotonic() > stop:
                self.server.log["gave_up"] = True
                return
            try:
                self.wfile.write(data[i:i + 1])
                self.wfile.flush()
            except OSError:
                self.server.log["cut_off_after"] = i
                return
            time.sleep(TRICKLE_GAP_S)

    def _trickle_headers(self) -> None:
        self._trickle(b"HTTP/1.1 200 OK\r\n" + b"X-Slow: " + b"z" * 10_000 + b"\r\n\r\n")

    def _trickle_body(self) -> None:
        body = json.dumps({"object": "list", "data": [{"id": MODEL, "pad": "z" * 10_000}]}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.flush()
        self._trickle(body)

    def _huge_unannounced(self) -> None:
        self.send_response(200)
        self.send_header("Connection", "close")
        self.end_headers()
        block = b"z" * (1024 * 1024)
        for _ in range(300):
            try:
                self.wfile.write(block)
            except OSError:
                return
            self.server.log["sent"] = self.server.log.get("sent", 0) + len(block)

    def _huge_announced(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(300 * 1024 * 1024))
        self.end_headers()
        self.wfile.write(b"{")

    def _echo_key_shapes(self) -> None:
        auth = self.headers.get("Authorization", "")
        key = auth.removeprefix("Bearer ")
        echoed = {
            "header": auth,
            "url": quote(key, safe=""),
            "b64": base64.b64encode(key.encode()).decode(),
            # puts the key across the point where the verifier shortens a quoted answer
            "cut": "x" * 180 + key,
        }
        body = json.dumps({"error": echoed}).encode()
        self.send_response(400)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def hostile(mode: str) -> Iterator[tuple[str, dict[str, Any]]]:
    server = _HostileServer(mode)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", server.log
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("mode", ["trickle_headers", "trickle_body"])
def test_a_trickling_server_is_cut_off_at_the_checks_deadline(mode, session):
    with hostile(mode) as (url, log):
        result = v.run_check("models", v.Target(url, MODEL, KEY, 1.0), session)
        time.sleep(2 * TRICKLE_GAP_S)  # the server notices the closed socket at its next write
    assert not result.passed
    assert "no complete answer from GET /v1/models within the 1s timeout of the check" in result.detail
    assert "cut_off_after" in log and "gave_up" not in log, log


def test_the_deadline_is_per_check_not_per_run(session):
    with hostile("trickle_body") as (url, _):
        results = v.run_checks(v.Target(url, MODEL, KEY, 1.0), only="models,auth", session=session)
    assert [r.passed for r in results] == [False, False]
    assert all("within the 1s timeout of the check" in r.detail for r in results)


def test_an_unannounced_huge_answer_is_read_only_up_to_the_cap(session):
    with hostile("huge_unannounced") as (url, log):
        result = v.run_check("models", v.Target(url, MODEL, KEY, 30), session)
    assert not result.passed
    assert f"answered more than {MAX_ANSWER_BYTES} bytes" in result.detail and "at most 16 MiB" in result.detail
    assert log["sent"] < 300 * 1024 * 1024, "the verifier kept reading past its cap"


def test_an_announced_huge_answer_is_refused_before_reading(session):
    with hostile("huge_announced") as (url, _):
        result = v.run_check("models", v.Target(url, MODEL, KEY, 30), session)
    assert not result.passed and f"announced {300 * 1024 * 1024} bytes" in result.detail


@pytest.mark.parametrize("key", [KEY, "sk-odd key/with+signs&=" + "q" * 20, "sk-é-ünïcode-" + "w" * 20])
def test_the_key_is_hidden_in_every_shape_a_server_echoes(key, session):
    with hostile("echo_key_shapes") as (url, _):
        result = v.run_check("models", v.Target(url, MODEL, key, 5), session)
    text = result.detail + json.dumps(result.metrics)
    assert not result.passed and "***" in text
    for shape in (key, quote(key, safe=""), base64.b64encode(key.encode()).decode(), key[:12]):
        assert shape not in text


def test_a_key_a_library_quotes_in_its_error_is_hidden(session):
    # requests refuses a header value with a newline and quotes the value, escaped, in its error
    key = "sk-first-line-0123456789\nsecond-line-abcdef"
    result = v.run_check("models", v.Target("http://127.0.0.1:9", MODEL, key, 1), session)
    assert not result.passed
    for shape in ("first-line-0123456789", "second-line-abcdef"):
        assert shape not in result.detail, result.detail


def test_redact_hides_json_and_repr_escaped_shapes():
    key = 'sk-"quoted"\\back\ttab-0123456789'
    text = json.dumps({"k": key}) + repr(key) + " ".join(key.split())
    assert v.redact(text, key).count("***") == 3 and "0123456789" not in v.redact(text, key)


def test_an_adapter_of_the_callers_own_is_kept_and_still_bounded(session):
    class Pinned(HTTPAdapter):
        """Stands for an adapter a caller mounts for its own TLS setup."""

    adapter = Pinned()
    session.mount("http://", adapter)
    with hostile("trickle_body") as (url, _):
        result = v.run_check("models", v.Target(url, MODEL, KEY, 1.0), session)
    assert session.get_adapter(url) is adapter
    assert "within the 1s timeout of the check" in result.detail


def test_a_request_on_a_kept_alive_connection_is_cut_off_at_the_deadline_too(session):
    # No connect() for the second request: its socket is watched when the request is sent.
    use_deadlines(session)
    with hostile("whole_then_trickle") as (url, log):
        assert session.get(url + "/first", timeout=5).content == b"{}"
        with Deadline(1.0), pytest.raises(requests.RequestException):
            session.get(url + "/second", timeout=5).raise_for_status()
        time.sleep(2 * TRICKLE_GAP_S)  # the server notices the closed socket at its next write
    assert log["connections"] == 1 and "cut_off_after" in log and "gave_up" not in log, log
