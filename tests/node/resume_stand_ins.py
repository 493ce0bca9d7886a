"""Stand-ins for the resuming layer's tests: a token server in the shape of vLLM's `/inference/v1/generate`, a
proxy in front of a replica that loses the connection after a given number of streamed events, by a reset or by
silence, a forwarder that goes away for a while, and a render server.

The token server is autoregressive like a model: its answer to a prompt is fixed (`REPLY`), and what follows the
prompt's last `PROMPT_END` token is the part of the answer already generated, which it continues. So a generation
cut anywhere and carried on elsewhere must come out as the uncut one. A prompt holding `FAIL` is answered 500 as
vLLM answers a request it cannot serve (an image it cannot fetch); one holding `ERROR_EVENT` gets two tokens, then
vLLM's error event (a continuation goes on past it); one holding `LONG` gets `max_tokens` tokens, as a model that
does not stop. Its chat endpoint answers a body holding "fail" with 500 too, any other with a short answer.

`render_server` stands in for vLLM's render server where its parsers are not the point: it renders a chat body to
such a prompt (its text's markers become the tokens above) and derenders each chunk to `<token>` text, and it
records the size of every call it gets (and answers a render of "malformed" text without its token ids).
The harness that drives the layer through them is tests/node/resume_fixtures.py.
"""

from __future__ import annotations

import json
import socket
import struct
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

PROMPT_END = 7
EOS = 2
REPLY = [100 + i for i in range(12)] + [EOS]
FAIL, ERROR_EVENT, LONG = 900, 901, 902
MARKERS = {"fail": FAIL, "error-event": ERROR_EVENT, "long": LONG}
# vLLM's error body (vllm/entrypoints/serve/exception_handling/error_response.py) for a request it cannot serve.
ENGINE_ERROR = {"error": {"message": "Cannot fetch the image", "type": "InternalServerError", "param": None,
                          "code": 500}}


class TokenServer(ThreadingHTTPServer):
    daemon_threads = True
    requests: list[dict[str, Any]]  # the token API's bodies
    chat_requests: list[dict[str, Any]]  # the chat endpoint's bodies
    token_s: float = 0.0  # a pause before each token
    flowing: threading.Event  # cleared, every stream holds before its next token until it is set again
    healthy: bool = True  # what /health answers
    sent: int = 0  # tokens written
    cut: int = 0  # streams whose reader went away before their end

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host!s}:{port}"


class _Tokens(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: TokenServer

    def log_message(self, *_: Any) -> None:
        pass

    def do_GET(self) -> None:
        self.send_response(404 if self.path != "/health" else 200 if self.server.healthy else 503)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers["Content-Length"]))
        body = json.loads(raw)
        if self.path != "/inference/v1/generate":
            self.server.chat_requests.append(body)
            return self._whole(500 if b"fail" in raw else 200, ENGINE_ERROR if b"fail" in raw else {
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}]})
        self.server.requests.append(body)
        ids = body["token_ids"]
        if FAIL in ids:
            return self._whole(500, ENGINE_ERROR)
        done = ids[len(ids) - ids[::-1].index(PROMPT_END):]
        max_tokens = body["sampling_params"]["max_tokens"]
        reply = [1000 + i for i in range(len(done) + max_tokens)] if LONG in ids else REPLY
        left = reply[len(done):][:max_tokens]
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            self._tokens(body, left, ERROR_EVENT in ids and not done)  # a continuation goes on past it
        except OSError:  # the reader went away: vLLM aborts such a request
            self.server.cut += 1

    def _whole(self, status: int, answer: dict[str, Any]) -> None:
        data = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _tokens(self, body: dict[str, Any], left: list[int], error_event: bool) -> None:
        for i, token in enumerate(left):
            if error_event and i == 2:
                self._event(ENGINE_ERROR)  # as vLLM ends a stream whose request failed, or whose engine died
                self._send(b"data: [DONE]\n\n")
                self.wfile.write(b"0\r\n\r\n")
                return
            if self.server.token_s:
                time.sleep(self.server.token_s)
            self.server.flowing.wait(timeout=120)
            last = i == len(left) - 1
            finish = ("stop" if token == EOS else "length") if last else None
            self._event({"request_id": body.get("request_id", "x"),
                         "choices": [{"index": 0, "token_ids": [token], "finish_reason": finish}]})
            self.server.sent += 1
        if (body.get("stream_options") or {}).get("include_usage"):
            ids = body["token_ids"]
            self._event({"request_id": "x", "choices": [],
                         "usage": {"prompt_tokens": len(ids), "completion_tokens": len(left),
                                   "total_tokens": len(ids) + len(left)}})
        self._send(b"data: [DONE]\n\n")
        self.wfile.write(b"0\r\n\r\n")

    def _event(self, chunk: dict[str, Any]) -> None:
        self._send(b"data: " + json.dumps(chunk).encode() + b"\n\n")

    def _send(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()


@contextmanager
def token_server(host: str = "127.0.0.1", port: int = 0) -> Iterator[TokenServer]:
    server = TokenServer((host, port), _Tokens)
    server.requests, server.chat_requests, server.flowing = [], [], threading.Event()
    server.flowing.set()
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


class CutProxy:
    """Relays TCP to `upstream`; after `cut_after` server-sent events of a POST's answer it loses the replica:
    `reset` closes both sides with RST, `silence` stops relaying anything and answers nothing from then on (new
    connections, health checks included, are accepted and left hanging), as a VM whose packets are dropped.
    `cut_after=0` loses it before any byte of a POST's answer (a request that is not streamed has no events)."""

    def __init__(self, upstream: str, cut_after: int | None, mode: str = "reset") -> None:
        host, _, port = upstream.removeprefix("http://").rpartition(":")
        self.upstream = (host, int(port))
        self.cut_after, self.mode = cut_after, mode
        self.lost = threading.Event()
        self.requests: list[dict[str, Any]] = []  # the JSON bodies of the POSTs it relayed
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.held: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.listener.getsockname()[1]}"

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if self.lost.is_set():
                if self.mode == "silence":
                    self.held.append(client)
                else:
                    _reset(client)
                continue
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection(self.upstream)
        except OSError:
            return client.close()
        try:
            self._relay(client, upstream)
        except OSError:  # either side went away (a health check outliving its test's servers): this relay ends
            if client not in self.held:
                client.close()
                upstream.close()

    def _relay(self, client: socket.socket, upstream: socket.socket) -> None:
        request = client.recv(1 << 20)
        head, _, body = request.partition(b"\r\n\r\n")
        length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                       if line.lower().startswith(b"content-length:")), 0)
        while len(body) < length:
            more = client.recv(1 << 20)
            if not more:
                break
            body += more
        request = head + b"\r\n\r\n" + body
        if request.startswith(b"POST") and body:
            self.requests.append(json.loads(body))
        upstream.sendall(request)
        cut_after = self.cut_after if request.startswith(b"POST") else None
        seen = 0
        while True:
            data = upstream.recv(65536)
            if not data:
                break
            if cut_after is not None:
                events = data.count(b"data: ")
                if cut_after == 0 or seen + events > cut_after:
                    if events:
                        client.sendall(data[:_event_start(data, cut_after - seen)])
                    self.lost.set()
                    if self.mode == "silence":
                        self.held += [client, upstream]
                        return
                    _reset(client)
                    upstream.close()
                    return
                seen += events
            client.sendall(data)
        client.close()
        upstream.close()

    def close(self) -> None:
        self.listener.close()
        for sock in self.held:
            sock.close()


def _event_start(data: bytes, n: int) -> int:
    """Where the chunk holding the (n+1)-th event of data starts (its chunk-size line): what comes before is whole."""
    at = -1
    for _ in range(n + 1):
        at = data.index(b"data: ", at + 1)
    size_line_end = data.rindex(b"\r\n", 0, at)
    before = data.rfind(b"\r\n", 0, size_line_end)
    return 0 if before < 0 else before + 2


def _reset(sock: socket.socket) -> None:
    """Close with RST (SO_LINGER 0), as a peer whose host is gone answers."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


class RestartingServer:
    """A forwarder in front of a server (the render server) that goes away for a while, as a container restarted by
    an image change does: connections `down_from` to `down_to` (counted from 1) are closed unanswered, every other
    one is forwarded whole. `refused` counts the ones closed."""

    def __init__(self, upstream: tuple[str, int], down_from: int, down_to: int) -> None:
        self.upstream, self.down = upstream, range(down_from, down_to + 1)
        self.seen = self.refused = 0
        self.lock = threading.Lock()
        self.sock = socket.create_server(("127.0.0.1", 0))
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def address(self) -> tuple[str, int]:
        return ("127.0.0.1", self.sock.getsockname()[1])

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            with self.lock:
                self.seen += 1
                closed = self.seen in self.down
                self.refused += closed
            if closed:
                _reset(client)
            else:
                threading.Thread(target=self._forward, args=(client,), daemon=True).start()

    def _forward(self, client: socket.socket) -> None:
        with client, socket.create_connection(self.upstream) as server:
            def pump(src: socket.socket, dst: socket.socket) -> None:
                try:
                    while data := src.recv(65536):
                        dst.sendall(data)
                    dst.shutdown(socket.SHUT_WR)
                except OSError:  # either side gone: the other's recv ends too
                    pass

            back = threading.Thread(target=pump, args=(server, client), daemon=True)
            back.start()
            pump(client, server)
            back.join()

    def close(self) -> None:
        self.sock.close()


class RenderStandIn(ThreadingHTTPServer):
    daemon_threads = True
    calls: list[tuple[str, int, dict[str, Any]]]  # (path, bytes received, body) of every call
    derender_s = 0.0  # how long each derender call takes, as vLLM's replay of a long stream does
    derender_spans: list[tuple[float, float]]  # (start, end) of every derender call, time.monotonic()

    @property
    def address(self) -> tuple[str, int]:
        return ("127.0.0.1", self.server_address[1])


class _Render(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: RenderStandIn

    def log_message(self, *_: Any) -> None:
        pass

    def do_GET(self) -> None:  # the resume step waits for it
        self.send_response(200 if self.path == "/health" else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers["Content-Length"]))
        body = json.loads(raw)
        self.server.calls.append((self.path, len(raw), body))
        if self.path.endswith("/render"):
            text = json.dumps(body.get("messages"))
            markers = [token for word, token in MARKERS.items() if word in text]
            answer: dict[str, Any] = {
                "request_id": "chatcmpl-render", "token_ids": [1, 5, 6, *markers, PROMPT_END],
                "model": body.get("model"),
                "sampling_params": {"max_tokens": body.get("max_tokens") or 64}, "stream": True,
                "parse_context": {"tools": None, "tool_choice": "none", "parallel_tool_calls": True,
                                  "include_reasoning": True, "chat_template_kwargs": {}, "history_tool_call_cnt": 0}}
            if "malformed" in text:  # an answer the layer does not expect: its own failure, not the client's
                del answer["token_ids"]
        else:
            began = time.monotonic()
            time.sleep(self.server.derender_s)
            self.server.derender_spans.append((began, time.monotonic()))
            chunk, state = body["generate_chunk"], body["stream_state"] or {"tokens": 0}
            choices = [{"index": 0, "delta": {"content": "".join(f"<{t}>" for t in c.get("token_ids") or [])},
                        "finish_reason": c.get("finish_reason")} for c in chunk.get("choices") or []]
            made = sum(len(c.get("token_ids") or []) for c in chunk.get("choices") or [])
            answer = {"chunk": {"id": "x", "object": "chat.completion.chunk", "created": 0, "model": "m",
                                "choices": choices, "usage": chunk.get("usage")},
                      "stream_state": {"tokens": state["tokens"] + made}}
        data = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def tokens_of(stream: bytes) -> list[int]:
    """The tokens a stream derendered by the stand-in carries (`<token>` text), in order."""
    out = []
    for event in stream.split(b"\n\n"):
        if event.startswith(b"data: {"):
            for choice in json.loads(event[6:]).get("choices") or []:
                text = (choice.get("delta") or {}).get("content") or ""
                out += [int(t) for t in text.replace(">", "").split("<") if t]
    return out


@contextmanager
def render_server(port: int = 0) -> Iterator[RenderStandIn]:
    server = RenderStandIn(("127.0.0.1", port), _Render)
    server.calls, server.derender_spans = [], []
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
