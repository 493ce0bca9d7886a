"""Stand-ins for the resuming layer's tests: a token server in the shape of vLLM's `/inference/v1/generate`, and a
proxy in front of it that loses the connection after a given number of streamed events, by a reset or by silence.

The token server is autoregressive like a model: its answer to a prompt is fixed (`REPLY`), and what follows the
prompt's last `PROMPT_END` token is the part of the answer already generated, which it continues. So a generation
cut anywhere and carried on elsewhere must come out as the uncut one. A prompt holding `FAIL` is answered 500 as
vLLM answers a request it cannot serve (an image it cannot fetch); one holding `ERROR_EVENT` gets two tokens, then
vLLM's error event (a continuation goes on past it); one holding `LONG` gets `max_tokens` tokens, as a model that
does not stop. Its chat endpoint answers a body holding "fail" with 500 too, any other with a short answer.

`render_server` stands in for vLLM's render server where its parsers are not the point: it renders a chat body to
such a prompt (its text's markers become the tokens above) and derenders each chunk to `<token>` text, and it
records the size of every call it gets (and answers a render of "malformed" text without its token ids). `layer`
runs the resuming layer in its own process, as the front does.

Over the engines' real chat layers (tests/engine_parsers: vLLM's render server, SGLang's chat layer): `through_layer`
sends one chat request through the layer's handler to a `Recorder`, `layer_over` serves the layer's HTTP server over a
replica behind a cutting proxy and its twin, and `assembled` and `error_of` read what came out.
"""

from __future__ import annotations

import json
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletionChunk

from kimi_cluster.fakes.inference.server import FakeInferenceServer
from kimi_cluster.fakes.inference.settings import FakeSettings
from kimi_cluster.fakes.sandbox_services import free_port
from kimi_cluster.node.resume import chat, server
from kimi_cluster.node.resume.generation import Limits
from kimi_cluster.node.resume.pool import Pool
from kimi_cluster.node.resume.render import RenderServers

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
    server.requests, server.chat_requests = [], []
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


class Layer:
    """The resuming layer as the front runs it: its own process (`python3 -m kimi_cluster.node.resume`), its log
    in a file, so its memory is its own to measure."""

    def __init__(self, process: subprocess.Popen[bytes], port: int, log: Path) -> None:
        self.process, self.port, self.log = process, port, log

    def _status(self, field: str) -> float:
        status = Path(f"/proc/{self.process.pid}/status").read_text()
        return int(next(line.split()[1] for line in status.splitlines() if line.startswith(field + ":"))) / 1024

    def peak_rss_mb(self) -> float:
        """The process's peak resident memory so far (VmHWM), in MiB."""
        return self._status("VmHWM")

    def rss_mb(self) -> float:
        return self._status("VmRSS")


@contextmanager
def layer(tmp: Path, render: tuple[str, int], replicas: list[str], *extra: str) -> Iterator[Layer]:
    port = free_port()  # below the ephemeral range: no other test's bind(port 0) takes it before the layer binds
    log = tmp / f"resume-{port}.log"
    argv = [sys.executable, "-m", "kimi_cluster.node.resume", "--listen", f"127.0.0.1:{port}",
            "--render", f"http://{render[0]}:{render[1]}", *[w for url in replicas for w in ("--replica", url)],
            "--health-interval-s", "0.1", "--health-timeout-s", "1", "--tick-s", "0.05", *extra]
    with log.open("wb") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=Path(__file__).parents[2])
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the layer did not start: {log.read_text()[-2000:]}") from None
                time.sleep(0.05)
        yield Layer(process, port, log)
    finally:
        process.terminate()
        process.wait(timeout=30)


def exchange(port: int, request: bytes, timeout_s: float = 30.0) -> tuple[int, dict[str, str], bytes]:
    """Send raw bytes to the layer and read its whole answer (it closes the connection after each): status,
    headers, body (chunks joined)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
        sock.sendall(request)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    if "chunked" in headers.get("transfer-encoding", ""):
        joined, rest = b"", body
        while rest:
            size_line, _, rest = rest.partition(b"\r\n")
            size = int(size_line or b"0", 16)
            if size == 0:
                break
            joined, rest = joined + rest[:size], rest[size + 2:]
        body = joined
    return int(lines[0].split()[1]), headers, body


def post(port: int, path: str, body: Any, headers: dict[str, str] | None = None,
         timeout_s: float = 30.0) -> tuple[int, dict[str, str], bytes]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    head = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    request = (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{head}"
               f"Content-Length: {len(data)}\r\n\r\n").encode() + data
    return exchange(port, request, timeout_s)


def trickle(sock: socket.socket, every_s: float, declared: int, give_up_s: float = 240.0) -> tuple[bytes, int]:
    """Sends a body's bytes one at a time, one each time `every_s` passes with no answer, until the server answers
    (or shuts its side and its answer is what is left to read) or `declared` bytes are sent: the answer's first bytes
    and how many were sent. `give_up_s` is a liveness bound far past any server's: the test fails, not hangs."""
    sock.settimeout(every_s)
    sent, answer = 0, b""
    give_up = time.monotonic() + give_up_s
    while not answer and sent < declared and time.monotonic() < give_up:
        try:
            answer = sock.recv(4096)
        except TimeoutError:
            try:
                sock.sendall(b" ")
            except OSError:  # the server has shut its side: its answer is what is left to read
                sock.settimeout(30)
                return sock.recv(4096), sent
            sent += 1
    return answer, sent


# ---- over an engine's real chat layer ------------------------------------------------------------------------------


class Recorder:
    """chat.Client keeping the stream's bytes."""

    def __init__(self) -> None:
        self.status: int | None = None
        self.data = b""

    def whole(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        self.status, self.data = status, body

    def start_stream(self) -> None:
        self.status = 200

    def write(self, data: bytes) -> None:
        self.data += data

    def end(self) -> None:
        pass


def through_layer(renders: list[tuple[str, int]], body: dict[str, Any], replicas: list[str], limits: Limits,
                  engine: str = "vllm") -> Recorder:
    """One chat request through the layer's handler, over `renders` (the engine's chat layer) and `replicas`."""
    # A reset is its own news: the health checks only keep a replica that answers them in the pool, slowly enough
    # that a loaded machine never takes the healthy twin for a lost one.
    pool = Pool(replicas, interval_s=0.2, timeout_s=5.0, fails=3, passes=2)
    pool.start()
    client = Recorder()
    try:
        chat.handle(chat.Front(pool, RenderServers(renders), limits, engine=engine), chat.CHAT_PATH,
                    json.dumps(body).encode(), client)
    finally:
        pool.stop.set()
    return client


# The layer's flags for a test that cuts streams: half a second of silence, and a replica that misses two health
# checks in a row (asked every 0.1 s, a second for each answer) is out of the pool. One miss of 0.2 s was too
# quick to tell a silent replica from a loaded machine: in CI both replicas went down on their first check, and the
# stream the test meant to cut started on the twin.
QUICK_TO_NOTICE = ("--silence-s", "0.5", "--health-interval-s", "0.1", "--health-timeout-s", "1.0",
                   "--health-fails", "2")
# What layer_over serves: the layer's URL, the cutting proxy in front of the first replica, the twin's recorder.
Served = tuple[str, CutProxy, CutProxy]


@contextmanager
def layer_over(render: tuple[str, int], settings: FakeSettings, *flags: str) -> Iterator[Served]:
    """The resuming layer's HTTP server (its engine the fake's) over a replica behind a cutting proxy (first in line)
    and its twin behind one that only records what it relays."""
    with FakeInferenceServer(settings) as lost, FakeInferenceServer(settings) as twin:
        proxy, recorder = CutProxy(lost.url, cut_after=None), CutProxy(twin.url, cut_after=None)
        args = server.parse(["--listen", "127.0.0.1:0", "--engine", settings.engine,
                             "--render", f"http://{render[0]}:{render[1]}",
                             "--replica", proxy.url, "--replica", recorder.url, *flags])
        front_server = server.build(args)
        front_server.front.pool.start()
        threading.Thread(target=front_server.serve_forever, daemon=True).start()
        try:
            yield f"http://127.0.0.1:{front_server.server_address[1]}", proxy, recorder
        finally:
            front_server.shutdown()
            front_server.front.pool.stop.set()
            proxy.close()
            recorder.close()


def assembled(stream: bytes) -> tuple[dict[str, Any], set[str]]:
    """The completion the openai SDK's accumulator makes of a chat stream, and every tool-call id in its deltas."""
    state: ChatCompletionStreamState = ChatCompletionStreamState()
    ids: set[str] = set()
    for event in stream.split(b"\n\n"):
        if not event.startswith(b"data: ") or event == b"data: [DONE]":
            continue
        chunk = json.loads(event[6:])
        assert "error" not in chunk, chunk
        for choice in chunk["choices"]:
            ids |= {c["id"] for c in choice["delta"].get("tool_calls") or [] if c.get("id")}
        state.handle_chunk(ChatCompletionChunk.model_validate(chunk))
    final = state.get_final_completion().model_dump()
    message = final["choices"][0]["message"]
    for call in message.get("tool_calls") or []:
        call.pop("id")  # the engine draws a new one per request: compared for stability within the stream instead
    return {"message": message, "finish": final["choices"][0]["finish_reason"], "usage": final["usage"]}, ids


def error_of(stream: bytes) -> str | None:
    """The message of the stream's error event, if it ended with one."""
    for event in stream.split(b"\n\n"):
        if event.startswith(b"data: {") and b'"error"' in event[:20]:
            return str(json.loads(event[6:])["error"]["message"])
    return None
