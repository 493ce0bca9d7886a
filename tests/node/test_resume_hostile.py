"""The resuming layer against a hostile client, each attack run against the real layer (its own process, on
loopback) over stand-ins for the replicas and the render server (resume_stand_ins.py):

- requests an engine answers 500 get that answer, and neither take a replica out of the pool nor cost another
  client's stream anything (security finding 1);
- a 2 MB junk field is not carried to the render server on every derender call (finding 2);
- a client that stops reading is held back and ended, its generation aborted, with the layer's memory bounded
  (finding 3);
- a client that trickles its body a byte at a time gets its 408 at the request's deadline;
- no id an engine sees is the client's, and no client-chosen multimodal cache key reaches one.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from pathlib import Path

import pytest

from kimi_cluster.node.resume.chat import DERENDER_SHARE
from kimi_cluster.node.resume.pool import printable
from tests.node.resume_fixtures import exchange, layer, post, trickle
from tests.node.resume_stand_ins import ENGINE_ERROR, EOS, REPLY, render_server, token_server, tokens_of

pytestmark = pytest.mark.integration

CHAT = "/v1/chat/completions"


def chat(text: str, stream: bool = True, **extra: object) -> dict:
    return {"model": "m", "stream": stream, "max_tokens": 64, "messages": [{"role": "user", "content": text}],
            **extra}


def test_answers_of_500_are_the_clients_own_and_cost_nobody_else_anything(tmp_path: Path) -> None:
    """One client loops on requests the engine answers 500 (streamed, not streamed, and an error event inside the
    stream) while another client's stream runs: the bad client gets the engine's own error each time, no replica
    leaves the pool, and the other stream is whole and was sent to a replica once."""
    with token_server() as first, token_server() as second, render_server() as render:
        for replica in (first, second):
            replica.token_s = 0.2  # the victim's stream runs while the bad requests come
        with layer(tmp_path, render.address, [first.url, second.url], "--health-fails", "1") as front:
            victim: dict = {}

            def run_victim() -> None:
                victim["answer"] = post(front.port, CHAT, chat("tell me"))

            thread = threading.Thread(target=run_victim)
            thread.start()
            deadline = time.monotonic() + 30
            while not first.requests + second.requests and time.monotonic() < deadline:
                time.sleep(0.01)  # the victim's generation is under way
            answers = []
            for _ in range(4):
                answers.append(post(front.port, CHAT, chat("fail on this image")))
                answers.append(post(front.port, CHAT, chat("fail on this image", stream=False)))
                answers.append(post(front.port, CHAT, chat("an error-event please")))
                answers.append(post(front.port, CHAT, chat("fail on this image", stop=["\n"])))  # passed through
            assert thread.is_alive()  # the bad requests came while the victim's stream ran
            thread.join(60)
            health = json.loads(exchange(front.port, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")[2])
            log = front.log.read_text()
    for status, _, body in answers[0::4] + answers[1::4] + answers[3::4]:
        assert (status, json.loads(body)) == (500, ENGINE_ERROR)
    for status, _, body in answers[2::4]:  # the error event inside the stream, as the engine sent it
        errors = [json.loads(e[6:]) for e in body.split(b"\n\n") if e.startswith(b"data: {\"error")]
        assert status == 200 and errors == [ENGINE_ERROR], body
    assert "is down" not in log and "carrying on" not in log, log
    assert health["replicas"] == [first.url, second.url]
    status, _, stream = victim["answer"]
    assert status == 200 and tokens_of(stream) == REPLY
    generates = [r for s in (first, second) for r in s.requests if 900 not in r["token_ids"]
                 and 901 not in r["token_ids"]]
    assert len(generates) == 1, generates  # the victim's generation was never sent again
    fails = sum(900 in r["token_ids"] for s in (first, second) for r in s.requests)
    assert fails == 4  # each bad stream went to one replica, once
    assert sum(len(s.chat_requests) for s in (first, second)) == 8  # and each bad whole or passed-through one


def test_a_dead_engines_error_event_carries_the_stream_on_the_twin(tmp_path: Path) -> None:
    """An error event from an engine whose health check then fails (vLLM's dead engine answers /health 503) is a
    lost replica: the stream carries on at the twin from the tokens delivered."""
    with token_server() as dead, token_server() as twin, render_server() as render:
        dead.healthy = False  # its engine died: the layer's own health checks take a tick to see it
        with layer(tmp_path, render.address, [dead.url, twin.url], "--health-interval-s", "30") as front:
            status, _, stream = post(front.port, CHAT, chat("an error-event please"))
    assert status == 200 and b'"error"' not in stream, stream
    assert len(dead.requests) == 1 and len(twin.requests) == 1
    assert twin.requests[0]["token_ids"][-2:] == REPLY[:2]  # carried on from the two tokens delivered


def test_a_derender_call_carries_the_parse_context_not_the_clients_body(tmp_path: Path) -> None:
    junk = "x" * (2 * 1024 * 1024)
    with token_server() as replica, render_server() as render:
        with layer(tmp_path, render.address, [replica.url]) as front:
            status, _, stream = post(front.port, CHAT, chat("tell me", junk=junk, logprobs=True, top_logprobs=2,
                                                            logprob_token_ids=list(range(5000))))
    assert status == 200 and tokens_of(stream) == REPLY
    renders = [size for path, size, _ in render.calls if path.endswith("/render")]
    derenders = [(size, body) for path, size, body in render.calls if path.endswith("/derender")]
    assert len(renders) == 1 and renders[0] > len(junk)  # the render reads the body once
    # About one call a token when the render server answers fast; on a loaded machine its calls pass 20 ms and the
    # layer merges the tokens that wait into the next call (DERENDER_SHARE): how many is the machine's, not the test's.
    assert derenders
    print(f"bytes sent per derender call: max {max(s for s, _ in derenders)}, body {renders[0]}")
    assert max(size for size, _ in derenders) < 4096, max(size for size, _ in derenders)
    sent = derenders[0][1]["chat_request"]
    assert "junk" not in sent and sent["messages"] == [] and sent["tool_choice"] == "none"
    assert (sent["logprobs"], sent["top_logprobs"], sent["logprob_token_ids"]) == (True, 2, [0])
    finishing = derenders[-1][1]["chat_request"]  # the stop token list goes with the chunk that stops
    assert REPLY[-1] == EOS and "stop_token_ids" not in finishing


def test_a_client_that_stops_reading_holds_its_replica_back_and_is_ended(tmp_path: Path) -> None:
    """A client asks for a long stream and never reads: the layer takes from the replica only what its bounded
    queue and the sockets' buffers hold, ends the request after its write timeout, and aborts the generation
    (the replica sees its reader go); another client is served meanwhile, and the layer's memory stays flat."""
    with token_server() as replica, render_server() as render:
        with layer(tmp_path, render.address, [replica.url], "--client-timeout-s", "2") as front:
            before = front.rss_mb()
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.connect(("127.0.0.1", front.port))
            body = json.dumps(chat("long please", max_tokens=200_000)).encode()
            sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s"
                         % (len(body), body))
            started = time.monotonic()
            other = post(front.port, CHAT, chat("tell me"))
            # How long the sockets' buffers take to fill is the machine's (some 40,000 tokens: 10 s idle, past 60 s
            # on 2 loaded cores); the layer's bound starts when they are full, which is when it stops taking tokens
            # from the replica: from then, its write timeout must end the request.
            taken, held_since = replica.sent, time.monotonic()
            deadline = started + 240
            while replica.cut == 0 and time.monotonic() < deadline:
                if replica.sent != taken:
                    taken, held_since = replica.sent, time.monotonic()
                time.sleep(0.05)
            ended_s, held_s = time.monotonic() - started, time.monotonic() - held_since
            peak = front.peak_rss_mb()
            sock.close()
            log = front.log.read_text()
    print(f"never-reading client: {replica.sent} tokens taken from the replica of 200000, ended after "
          f"{ended_s:.1f} s, {held_s:.1f} s after it last took one; layer RSS {before:.1f} MiB before, peak "
          f"{peak:.1f} MiB")
    assert replica.cut == 1, "the replica never saw the generation aborted"
    assert held_s < 30, f"the request was ended {held_s:.1f} s after the layer stopped taking tokens (timeout 2 s)"
    # Held back: without backpressure the layer would read all 200,000. What the buffers hold is counted in bytes:
    # about 40,500 tokens alone on this 2-core machine, 50,281 beside a second suite, where slow derender calls
    # merge more tokens into each chunk the client is sent, so fewer bytes carry each token.
    assert replica.sent < 100_000
    assert peak - before < 50
    assert other[0] == 200 and tokens_of(other[2]) == REPLY
    assert "read nothing for 2 s" in log and "Traceback" not in log


def test_a_client_that_trickles_its_body_gets_its_408_at_the_requests_deadline(tmp_path: Path) -> None:
    """A byte of body now and then keeps every read within the socket's timeout; the request's own deadline (the
    client timeout, from the connection) still ends it with a 408 long before the body is whole, and another
    client is served meanwhile."""
    declared = 100_000
    with token_server() as replica, render_server() as render:
        with layer(tmp_path, render.address, [replica.url], "--client-timeout-s", "2") as front:
            sock = socket.create_connection(("127.0.0.1", front.port))
            sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n{"
                         % declared)
            # Each byte waits for an answer at most 0.5 s: less than the layer's 2 s a read.
            answer, trickled = trickle(sock, 0.5, declared - 1)
            sent = 1 + trickled
            other = post(front.port, CHAT, chat("tell me"))
            sock.close()
            log = front.log.read_text()
    print(f"trickling client: {sent} bytes of {declared} sent before its answer")
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert sent < declared
    assert other[0] == 200 and tokens_of(other[2]) == REPLY
    assert "did not arrive within 2 s" in log and "Traceback" not in log


def test_a_costly_stream_leaves_the_render_server_to_the_others(tmp_path: Path) -> None:
    """A long stream whose derender calls are costly (vLLM replays the stream on each) takes at most its share of
    the one render server: between its calls it leaves the server to others, its tokens meanwhile merged into the
    next call. A client that stops reading behind the front's buffers is such a stream, taken at full speed."""
    with token_server() as replica, render_server() as render:
        replica.token_s = 0.002
        render.derender_s = 0.04  # over MERGE_AFTER_S: as a call on a stream some thousand tokens long
        # The production keep-alive tick (0.5 s), which bounds how long a stream leaves the server.
        with layer(tmp_path, render.address, [replica.url], "--tick-s", "0.5") as front:
            status, _, body = post(front.port, CHAT, chat("long please", max_tokens=300))
    spans = render.derender_spans
    busy = sum(end - start for start, end in spans)
    share = busy / (spans[-1][1] - spans[0][0])
    print(f"a costly stream: {len(spans)} derender calls for 300 tokens, {share:.0%} of the render server's time")
    assert status == 200 and tokens_of(body) == [1000 + i for i in range(300)]
    assert share <= DERENDER_SHARE + 0.05, share  # before: about 95 %, one call after the other
    assert len(spans) < 100  # the tokens of the pauses went out merged


def test_every_id_an_engine_sees_is_the_fronts_and_no_client_chooses_a_cache_key(tmp_path: Path) -> None:
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}, "uuid": "victims-image"}
    messages = [{"role": "user", "content": [{"type": "text", "text": "what is it"}, image]}]
    forged = "victim\x1b[31m\nkimi-resume: forged line"
    with token_server() as replica, render_server() as render:
        with layer(tmp_path, render.address, [replica.url]) as front:
            for stream in (True, False):
                body = {"model": "m", "stream": stream, "messages": messages, "request_id": forged,
                        "mm_payload": "none"}
                status, _, _ = post(front.port, CHAT, body, {"X-Request-Id": "victim-id"})
                assert status == 200
            log = front.log.read_text()
    rendered = [body for path, _, body in render.calls if path.endswith("/render")]
    for sent in rendered + replica.chat_requests:
        assert "mm_payload" not in sent and "uuid" not in json.dumps(sent["messages"])
        assert sent.get("request_id", "kimi-").startswith("kimi-")
    assert replica.chat_requests[0]["request_id"].startswith("kimi-")
    assert all(r["request_id"].startswith("kimi-") for r in replica.requests)
    assert "\x1b" not in log and "forged line" not in log
    assert printable("a\x1b[31m\nb") == "a\\x1b[31m\\nb"
