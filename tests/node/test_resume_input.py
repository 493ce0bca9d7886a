"""The resuming layer's own inputs (bad input class 1 of issue 52), each sent to the layer in its own process: a
4xx naming the field in vLLM's error shape, no traceback to the client or the log, the next request served, and the
layer's memory bounded under the worst body a key holder can send."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from kimi_cluster.node.resume import request, server
from kimi_cluster.plan.front_tuning import FrontTuning
from kimi_cluster.plan.resume import resumer_argv
from tests.node.resume_fixtures import Layer, exchange, layer, post
from tests.node.resume_stand_ins import render_server, token_server

pytestmark = pytest.mark.integration

CHAT = "/v1/chat/completions"
HELLO = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hello"}]}


@pytest.fixture(scope="module")
def front(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Layer]:
    with token_server() as replica, render_server() as render:
        with layer(tmp_path_factory.mktemp("layer"), render.address, [replica.url],
                   "--client-timeout-s", "1") as running:
            yield running


def served(front: Layer) -> None:
    """The layer still serves: a stream and a whole request."""
    status, headers, body = post(front.port, CHAT, dict(HELLO, stream=True))
    assert status == 200 and headers["content-type"] == "text/event-stream" and body.endswith(b"data: [DONE]\n\n")
    assert post(front.port, CHAT, HELLO)[0] == 200


def refused(answer: tuple[int, dict[str, str], bytes], status: int, naming: str) -> None:
    got, _, body = answer
    error = json.loads(body)["error"]
    assert (got, error["code"]) == (status, status), body
    assert naming in error["message"] or naming == error["param"], error
    assert set(error) == {"message", "type", "param", "code"}
    assert "Traceback" not in error["message"]


@pytest.mark.parametrize(("body", "status", "naming"), [
    (dict(HELLO, stream=True, stream_options=[]), 400, "stream_options"),
    (dict(HELLO, stream=True, stream_options="yes"), 400, "stream_options"),
    (dict(HELLO, stream=True, stream_options={"include_usage": "sometimes"}), 400, "stream_options.include_usage"),
    (dict(HELLO, stream="maybe"), 400, "stream"),
    (dict(HELLO, stream=2), 400, "stream"),
    (dict(HELLO, stream=[]), 400, "stream"),
    ([HELLO], 400, "JSON object"),
    (b"{not json", 400, "not JSON"),
    (b"\xff\xfe", 400, "not JSON"),
    (b'{"a":' * 1000 + b"1" + b"}" * 1000, 400, "nested"),
    (b'{"a":' * (request.MAX_DEPTH + 5) + b"1" + b"}" * (request.MAX_DEPTH + 5), 400, "nested"),
    (b'[' * 5000, 400, "nested"),
])
def test_a_bad_body_gets_a_4xx_naming_the_field(front: Layer, body: object, status: int, naming: str) -> None:
    refused(post(front.port, CHAT, body if isinstance(body, bytes) else json.dumps(body).encode()), status, naming)
    served(front)


def test_text_is_sent_on_as_it_came(front: Layer) -> None:
    """Non-ASCII text goes on as UTF-8 (not six bytes a character), and a lone surrogate escaped as it came."""
    for text in ("東京の天気は？" * 1000, "\ud800 alone"):
        assert post(front.port, CHAT, dict(HELLO, messages=[{"role": "user", "content": text}]))[0] == 200
    assert request.encoded({"t": "東京"}) == '{"t": "東京"}'.encode()
    assert request.encoded({"t": "\ud800"}) == b'{"t": "\\ud800"}'


def test_a_messages_body_is_read_as_vllms_messages_model_reads_it(front: Layer) -> None:
    """vLLM's Anthropic model has no stream_options (it ignores the field), and reads `stream` as a lax bool."""
    assert post(front.port, "/v1/messages", dict(HELLO, stream="false", stream_options=[]))[0] == 200
    refused(post(front.port, "/v1/messages", dict(HELLO, stream="maybe")), 400, "stream")


def test_stream_is_read_as_vllm_reads_it(front: Layer) -> None:
    """pydantic's lax bool, as vLLM's `stream: bool | None`: "false" is false (a whole answer), "true" true."""
    for value in ("false", "False", "off", 0, None):
        status, headers, _ = post(front.port, CHAT, dict(HELLO, stream=value))
        assert (status, headers["content-type"]) == (200, "application/json"), value
    for value in ("true", "YES", 1):
        status, headers, _ = post(front.port, CHAT, dict(HELLO, stream=value))
        assert (status, headers["content-type"]) == (200, "text/event-stream"), value


def raw_post(head: str, body: bytes = b"") -> bytes:
    return f"POST {CHAT} HTTP/1.1\r\nHost: x\r\n{head}\r\n".encode() + body


@pytest.mark.parametrize(("framing", "status", "naming"), [
    (raw_post("Content-Length: abc\r\n"), 400, "Content-Length"),
    (raw_post("Content-Length: -1\r\n"), 400, "Content-Length"),
    (raw_post("Content-Length: 1e3\r\n"), 400, "Content-Length"),
    (raw_post(f"Content-Length: {server.MAX_BODY + 1}\r\n"), 413, "larger than"),
    (raw_post("Transfer-Encoding: chunked\r\n", b"-1\r\n"), 400, "Transfer-Encoding"),
    (raw_post("Transfer-Encoding: chunked\r\n", b"zz\r\n{}\r\n0\r\n\r\n"), 400, "Transfer-Encoding"),
    (raw_post("Transfer-Encoding: chunked\r\n", b"ffffffffffffffffff\r\n"), 400, "Transfer-Encoding"),
    (raw_post("Transfer-Encoding: chunked\r\n", b"1000001\r\n"), 413, "larger than"),
])
def test_bad_framing_gets_a_4xx_naming_the_header(front: Layer, framing: bytes, status: int, naming: str) -> None:
    refused(exchange(front.port, framing), status, naming)
    served(front)


def test_good_chunks_are_read(front: Layer) -> None:
    data = json.dumps(HELLO).encode()
    chunks = b"".join(b"%x;ext=1\r\n%s\r\n" % (len(part), part) for part in (data[:10], data[10:])) + b"0\r\n\r\n"
    assert exchange(front.port, raw_post("Transfer-Encoding: chunked\r\n", chunks))[0] == 200


def test_a_body_declared_and_never_sent_is_a_408_and_frees_the_thread(front: Layer) -> None:
    started = time.monotonic()
    answer = exchange(front.port, raw_post("Content-Length: 100\r\n", b'{"mod'), timeout_s=30)
    assert time.monotonic() - started < 10  # --client-timeout-s 1
    refused(answer, 408, "did not arrive")
    served(front)


def test_an_unexpected_failure_is_a_short_500_and_one_log_line(front: Layer) -> None:
    before = front.log.read_text()
    refused(post(front.port, CHAT, dict(HELLO, stream=True, messages=[{"role": "user", "content": "malformed"}])),
            500, "the resuming layer failed on this request (KeyError)")
    added = front.log.read_text()[len(before):]
    assert added.count("\n") == 1 and "unexpected KeyError" in added, added
    served(front)


def test_no_traceback_reaches_the_log(front: Layer) -> None:
    assert "Traceback" not in front.log.read_text()


def test_the_body_limit_is_what_the_fronts_caddy_buffers() -> None:
    """The front's step hands the layer Caddy's buffer as its limit; the program's own default (a layer run by
    hand) is the same figure."""
    argv = resumer_argv()
    limit = int(argv[argv.index("--max-body-bytes") + 1])
    assert limit == FrontTuning().request_buffer_bytes == 16 * 1024 * 1024 == server.MAX_BODY


PARSE_PATIENCE_S = 240  # under the test's own timeout (pytest.ini's 300 s)


@pytest.mark.timeout(300)
def test_the_worst_body_keeps_the_layer_bounded(tmp_path: Path) -> None:
    """16 MiB bodies of tiny values: past the bounds they are refused unread; within them (the most objects and
    values the layer parses, the rest one long string) the layer's peak memory is measured and bounded."""
    size = server.MAX_BODY - 1024
    objects = b'{"model":"m","messages":[],"x":[' + b"{}," * (size // 3) + b"{}]}"
    values = b'{"model":"m","messages":[],"x":[' + b'"ab",' * (size // 5) + b'"ab"]}'
    parsed = request.MAX_CONTAINERS - 10
    worst = (b'{"model":"m","messages":[],"x":[' + b"{}," * parsed + b'"ab",' * (request.MAX_VALUES - parsed - 10)
             + b'"' + b"y" * size + b'"]}')[:size] + b'"]}'
    with token_server() as replica, render_server() as render:
        with layer(tmp_path, render.address, [replica.url]) as front:
            idle = front.peak_rss_mb()
            refused(post(front.port, CHAT, objects), 400, "objects and arrays")
            refused(post(front.port, CHAT, values), 400, "values")
            refused_peak = front.peak_rss_mb()
            # What is bounded here is memory: how long the parse of a million values takes is the machine's (about
            # a second idle; four at once passed a 30 s client timeout on 2 loaded cores), so the client waits for
            # the answer as long as the test may run.
            for _ in range(3):
                assert post(front.port, CHAT, worst, timeout_s=PARSE_PATIENCE_S)[0] == 200
            worst_peak = front.peak_rss_mb()
            with ThreadPoolExecutor(4) as clients:
                answers = clients.map(lambda _: post(front.port, CHAT, worst, timeout_s=PARSE_PATIENCE_S), range(4))
                assert [a[0] for a in answers] == [200] * 4
            four_peak = front.peak_rss_mb()
            served(front)
    print(f"layer peak RSS: idle {idle:.0f} MiB; 16 MiB bodies refused unread {refused_peak:.0f} MiB; the worst "
          f"body parsed ({parsed} objects, {request.MAX_VALUES} values, 16 MiB) {worst_peak:.0f} MiB, four of them at "
          f"once {four_peak:.0f} MiB")
    assert refused_peak - idle < 100
    assert worst_peak - idle < 300
    assert four_peak - idle < 500
