"""The harness of the resuming layer's tests (its stand-in servers are in tests/node/resume_stand_ins.py).

`layer` runs the resuming layer in its own process, as the front does; `exchange`, `post` and `trickle` talk to it
as raw clients. Over the engines' real chat layers (tests/engine_parsers: vLLM's render server, SGLang's chat
layer): `through_layer` sends one chat request through the layer's handler to a `Recorder`, `layer_over` serves the
layer's HTTP server over a replica behind a cutting proxy and its twin, and `assembled` and `error_of` read what
came out.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
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
from tests.node.resume_stand_ins import CutProxy


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
