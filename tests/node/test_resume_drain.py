"""The resuming layer told to stop (SIGTERM, as `systemctl stop` sends it) hands over: its listener is closed at once
(a connect right after is refused, so the front's Caddy dials the next layer instead of queueing on this one), the
requests it took finish whole, and it exits 0 when they have, or after `--drain-s` when one never ends."""

from __future__ import annotations

import signal
import socket
import threading
import time
from pathlib import Path

import pytest

from tests.node.resume_fixtures import layer, post
from tests.node.resume_stand_ins import REPLY, render_server, token_server, tokens_of

pytestmark = pytest.mark.integration

CHAT = "/v1/chat/completions"


def chat(text: str, max_tokens: int = 64) -> dict:
    return {"model": "m", "stream": True, "max_tokens": max_tokens, "messages": [{"role": "user", "content": text}]}


def wait_until(condition, timeout_s: float = 30.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except ConnectionRefusedError:
        return True
    return False


def test_sigterm_closes_the_listener_at_once_and_the_stream_in_flight_finishes_whole(tmp_path: Path) -> None:
    with token_server() as replica, render_server() as render:
        replica.token_s = 0.1  # the whole reply takes over a second: SIGTERM comes in its middle
        with layer(tmp_path, render.address, [replica.url]) as front:
            answer: dict = {}
            thread = threading.Thread(target=lambda: answer.update(got=post(front.port, CHAT, chat("hello"))))
            thread.start()
            wait_until(lambda: replica.sent >= 2, what="the stream to start")
            front.process.send_signal(signal.SIGTERM)
            signalled = time.monotonic()
            wait_until(lambda: refused(front.port), timeout_s=5, what="the listener to close")
            closed_after_s = time.monotonic() - signalled
            assert replica.sent < len(REPLY), "the listener closed only once the stream had ended"
            assert front.process.poll() is None, "the layer exited with a stream in flight"
            thread.join(timeout=30)
            status, _, body = answer["got"]
            assert status == 200 and tokens_of(body) == REPLY and body.rstrip().endswith(b"data: [DONE]"), body
            assert front.process.wait(timeout=10) == 0
            assert replica.cut == 0
            log = front.log.read_text()
            assert "every request taken was answered" in log, log
    # Well under serve_forever's 0.5 s poll: the close follows the signal, not a timer.
    assert closed_after_s < 0.4, closed_after_s


def test_a_request_that_never_ends_is_cut_at_the_drain_bound_and_the_layer_exits_0(tmp_path: Path) -> None:
    with token_server() as replica, render_server() as render:
        replica.token_s = 0.05
        with layer(tmp_path, render.address, [replica.url], "--drain-s", "1") as front:
            threading.Thread(target=lambda: post(front.port, CHAT, chat("long", max_tokens=100_000), timeout_s=60),
                             daemon=True).start()
            wait_until(lambda: replica.sent >= 2, what="the stream to start")
            front.process.send_signal(signal.SIGTERM)
            signalled = time.monotonic()
            assert front.process.wait(timeout=20) == 0
            waited_s = time.monotonic() - signalled
            assert waited_s >= 1.0, waited_s  # it waited its bound for the request ...
            assert replica.sent < 100_000  # ... which then ended with it
            log = front.log.read_text()
            assert "1 requests still going after 1 s" in log, log
