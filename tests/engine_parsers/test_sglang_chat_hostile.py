"""SGLang's chat layer on the front (kimi_cluster/node/sglang_chat.py, SGLang 0.5.23 in the parsers' venv) against a
hostile caller, as the resuming layer is against its clients (tests/node/test_resume_hostile.py): malformed JSON, a
huge body, deep nesting, fields it cannot take, a body that never finishes and one that trickles, a caller that stops
reading. Each gets a 4xx naming the field or header, or a bounded close; and the layer serves a real render to
another caller meanwhile and after.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kimi_cluster.node import sglang_chat
from kimi_cluster.node.resume import wire
from tests.engine_parsers.render_server import require_sglang, sglang_chat_server
from tests.node.resume_fixtures import exchange, post, trickle

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

require_sglang()

TIMEOUT_S = 2.0  # the layer's --client-timeout-s here
RENDER = "/v1/chat/completions/render"
DERENDER = "/v1/chat/completions/derender"
RESUME = "/v1/chat/completions/resume"


@pytest.fixture(scope="module")
def layer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, Path]]:
    """The chat layer's port and its log."""
    folder = tmp_path_factory.mktemp("sglang-chat-hostile")
    with sglang_chat_server(folder, "--client-timeout-s", f"{TIMEOUT_S:g}") as url:
        yield wire.address(url)[1], folder / "render.log"


def chat(rid: str, content: str = "hi") -> dict:
    return {"request_id": rid, "model": "m", "messages": [{"role": "user", "content": content}]}


def rendered(port: int, rid: str) -> list[int]:
    """A real render still served: the prompt's token ids."""
    status, _, body = post(port, RENDER, chat(rid))
    assert status == 200, body
    return list(json.loads(body)["generate"]["input_ids"])


def head(path: str, *lines: str) -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\n" + "".join(f"{line}\r\n" for line in lines) + "\r\n").encode()


def raw_post(path: str, body: bytes) -> bytes:
    return head(path, f"Content-Length: {len(body)}") + body


def error(answer: tuple[int, dict[str, str], bytes]) -> tuple[int, str, str | None]:
    status, headers, body = answer
    assert headers.get("connection") == "close"
    detail = json.loads(body)["error"]
    return status, detail["message"], detail["param"]


NESTED = b'{"request_id": "deep", "messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
HOSTILE = [
    ("malformed JSON", raw_post(RENDER, b'{"request_id": "x", "messages": '), 400, "not JSON", None),
    ("a body that is no object", raw_post(RENDER, b"[1, 2]"), 400, "must be a JSON object", None),
    ("a Content-Length that is no number", head(RENDER, "Content-Length: 12abc"), 400, "Content-Length must be",
     "Content-Length"),
    ("a huge body, declared", head(RENDER, f"Content-Length: {sglang_chat.MAX_BODY + 1}"), 413, "larger than", None),
    ("a huge body, chunked", head(RENDER, "Transfer-Encoding: chunked") + b"ffffffff\r\n", 413, "larger than", None),
    ("a chunk size that is no number", head(RENDER, "Transfer-Encoding: chunked") + b"zz\r\n", 400,
     "hexadecimal", "Transfer-Encoding"),
    ("deep nesting", raw_post(RENDER, NESTED), 400, "nested more than", None),
    ("no request id", raw_post(RENDER, json.dumps({"messages": []}).encode()), 400, "request_id", "request_id"),
    ("messages that are no list", raw_post(RENDER, json.dumps({**chat("m"), "messages": "hi"}).encode()), 400,
     "valid list", "messages"),
    ("output ids that are no ids", raw_post(DERENDER, b'{"stream": "s", "output_ids": ["1", 2.5]}'), 400,
     "output_ids", "output_ids"),
    ("a negative output id", raw_post(RESUME, b'{"stream": "s", "output_ids": [-1]}'), 400, "output_ids",
     "output_ids"),
    ("a finish that is no object", raw_post(DERENDER, b'{"stream": "s", "output_ids": [], "finish": "stop"}'), 400,
     "finish", "finish"),
    ("a stream it never opened", raw_post(RESUME, b'{"stream": "nobody", "output_ids": [1]}'), 409, "no such stream",
     None),
]


@pytest.mark.parametrize(("case", "request_bytes", "status", "says", "param"), HOSTILE,
                         ids=[case[0] for case in HOSTILE])
def test_a_malformed_or_costly_call_gets_a_4xx_naming_what_and_the_layer_serves_on(
        layer: tuple[int, Path], case: str, request_bytes: bytes, status: int, says: str, param: str | None) -> None:
    port, log = layer
    started = time.monotonic()
    answer = error(exchange(port, request_bytes))
    took = time.monotonic() - started
    assert answer[0] == status and says in answer[1] and answer[2] == param, (case, answer)
    assert took < TIMEOUT_S, f"{case}: answered after {took:.1f} s, not at once"
    assert rendered(port, f"after-{case}")
    assert "Traceback" not in log.read_text(errors="replace")


def test_a_body_that_never_finishes_or_trickles_gets_its_408_at_the_requests_deadline(
        layer: tuple[int, Path]) -> None:
    """A silent body and one that comes a byte at a time (each read well within the socket's timeout) both end at
    the request's deadline, the client timeout from the connection, with a 408; another caller's render is served
    meanwhile, at once."""
    port, log = layer
    declared = 100_000
    silent = socket.create_connection(("127.0.0.1", port))
    trickling = socket.create_connection(("127.0.0.1", port))
    started = time.monotonic()
    for sock in (silent, trickling):
        sock.sendall(head(RENDER, f"Content-Length: {declared}") + b"{")
    before = time.monotonic()
    rendered(port, "meanwhile")  # both callers hold a thread, each waiting for its body
    meanwhile = time.monotonic() - before
    # A byte each time a quarter of the layer's timeout passes with no answer: each read well within its timeout.
    answer, trickled = trickle(trickling, TIMEOUT_S / 4, declared - 1, give_up_s=120)
    sent = 1 + trickled
    trickled_s = time.monotonic() - started
    silent.settimeout(30)
    quiet = silent.recv(4096)
    for sock in (silent, trickling):
        sock.close()
    print(f"never-finished bodies: trickling one answered after {trickled_s:.1f} s ({sent} bytes of {declared}); "
          f"another caller's render meanwhile took {meanwhile:.2f} s")
    # The status line only: the answer's first read may hold the head alone (a loaded CI run's did), and a close
    # over the bytes the caller sent after the deadline may reset the rest away. Its reason is in the log.
    for got in (answer, quiet):
        assert got.startswith(b"HTTP/1.1 408"), got[:200]
    assert TIMEOUT_S <= trickled_s < TIMEOUT_S + 10 and sent < declared
    assert meanwhile < TIMEOUT_S
    assert "a caller's body did not arrive within 2 s" in log.read_text(errors="replace")


def test_a_caller_that_stops_reading_is_ended_and_others_are_served(layer: tuple[int, Path]) -> None:
    """A render whose answer (some 10 MB of token ids) is far more than the sockets hold, asked by a caller that
    never reads: the layer's write waits at most the client timeout, then the connection is ended short of its
    Content-Length; another caller's render is served meanwhile."""
    port, log = layer
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    sock.sendall(raw_post(RENDER, json.dumps(chat("never-read", "x" * 2_000_000)).encode()))
    started = time.monotonic()
    meanwhile = rendered(port, "beside-never-read")
    ended = "a caller read nothing of its answer for 2 s"
    give_up = started + 120
    while ended not in log.read_text(errors="replace") and time.monotonic() < give_up:
        time.sleep(0.1)
    ended_s = time.monotonic() - started
    sock.settimeout(30)
    data = b""
    try:
        while chunk := sock.recv(1 << 20):
            data += chunk
    except ConnectionResetError:
        pass
    sock.close()
    headers, _, body = data.partition(b"\r\n\r\n")
    declared = int(next(line.split(b":")[1] for line in headers.split(b"\r\n")
                        if line.lower().startswith(b"content-length")))
    print(f"never-reading caller: ended after {ended_s:.1f} s, {len(body)} bytes of its {declared} had gone")
    assert ended_s < 60, f"the never-reading caller held its thread {ended_s:.1f} s (client timeout 2 s)"
    assert declared > 5_000_000 and len(body) < declared
    assert meanwhile
    assert rendered(port, "after-never-read")
