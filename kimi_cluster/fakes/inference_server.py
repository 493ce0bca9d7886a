"""A local stand-in for the Kimi K3.1 Pro endpoint: OpenAI and Anthropic routes in SGLang's, vLLM's or TokenSpeed's
shape.
Scripted answers that depend on the request (tool results, real pixels, prior reasoning), plus --fault modes.

Like vLLM 0.33 (vllm/entrypoints/serve/middleware/authenticate.py guards only /v1, /v2, /inference, /cohere), the
vLLM shape serves /invocations (full inference) and /tokenize without the key, and both shapes /metrics: the holes the
head's proxy closes. TokenSpeed's shape is its smg gateway's (tokenspeed-smg 1.10.1): the thinking as
`reasoning_content`, no /metrics on the API port but on a Prometheus listener of its own (--prometheus-host/-port),
smg_router_requests_total and smg_router_tokens_total{token_type="input"|"output"}, tokens counted for streamed chat
and Anthropic messages only (smg's metrics docs).
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import os
import re
import signal
import ssl
import struct
import sys
import threading
import time
import uuid
import zlib
from base64 import b64decode
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

DEFAULT_MODEL = "moonshotai/Kimi-K3.1-Pro"
ENGINES = ("sglang", "vllm", "tokenspeed")
EFFORTS = ("low", "high", "max")

FAULTS: dict[str, str] = {
    "no_auth": "accept every request, with or without a key",
    "no_reasoning": "no reasoning field: the thinking lands inline in content, as without a reasoning parser",
    "bad_tool_args": "tool-call arguments that are not JSON",
    "wrong_model": "serve another model id than --served-model-name",
    "drop_reasoning": "ignore the reasoning of earlier assistant turns",
    "no_image": "refuse image input with HTTP 400",
    "server_error": "HTTP 500 on every generation request",
    "slow": "sleep --slow-seconds before answering every generation request",
}


class HttpError(Exception):
    """An answer other than 200, with the engine-style JSON error body."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class FakeSettings:
    """How the fake behaves; `faults` names entries of FAULTS."""

    engine: str = "sglang"
    served_model_names: tuple[str, ...] = (DEFAULT_MODEL,)
    api_key: str | None = field(default=None, repr=False)
    max_model_len: int = 1048576
    faults: frozenset[str] = frozenset()
    slow_seconds: float = 30.0
    # Decode time per generated token (FAKE_ENGINE_TOKEN_SECONDS): a stream is paced by it and a non-streamed
    # answer comes after all of it, as on a real engine, so that load tests have requests in flight.
    token_seconds: float = 0.0

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise ValueError(f"engine must be one of {ENGINES}, got {self.engine!r}")
        unknown = sorted(set(self.faults) - set(FAULTS))
        if unknown:
            raise ValueError(f"unknown fault(s) {unknown}; known: {', '.join(FAULTS)}")
        if not self.served_model_names:
            raise ValueError("at least one served model name is needed")

    @property
    def reasoning_field(self) -> str:
        return "reasoning" if self.engine == "vllm" else "reasoning_content"

    @property
    def accepted_reasoning_fields(self) -> tuple[str, ...]:
        # vLLM takes either name back in; SGLang and smg read only their own
        return ("reasoning", "reasoning_content") if self.engine == "vllm" else ("reasoning_content",)

    @property
    def model_ids(self) -> tuple[str, ...]:
        if "wrong_model" not in self.faults:
            return self.served_model_names
        wrong = []
        for name in self.served_model_names:
            alias = name.rsplit("/", 1)[-1].lower()
            wrong.append(alias if alias != name else name + "-other")
        return tuple(wrong)


@dataclass
class Reply:
    reasoning: str
    content: str | None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)

    @property
    def finish_reason(self) -> str:
        return "tool_calls" if self.tool_calls else "stop"


# --------------------------------------------------------------------------- PNG


_PALETTE = {
    "red": (255, 0, 0),
    "green": (0, 255, 0),
    "blue": (0, 0, 255),
    "yellow": (255, 255, 0),
    "cyan": (0, 255, 255),
    "magenta": (255, 0, 255),
    "orange": (255, 165, 0),
    "white": (255, 255, 255),
    "black": (0, 0, 0),
    "grey": (128, 128, 128),
}


def decode_png(data: bytes) -> tuple[int, int, int, list[bytes]]:
    """(width, height, bytes per pixel, unfiltered rows) of an 8-bit RGB or RGBA PNG."""
    if not data.startswith(b"\x89PNG\r\n\x1a\n"):
        raise ValueError("not a PNG (bad signature)")
    pos, header, idat = 8, None, []
    while pos + 8 <= len(data):
        length, tag = struct.unpack(">I4s", data[pos : pos + 8])
        body = data[pos + 8 : pos + 8 + length]
        pos += 12 + length
        if tag == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif tag == b"IDAT":
            idat.append(body)
        elif tag == b"IEND":
            break
    if header is None or not idat:
        raise ValueError("PNG without IHDR or IDAT")
    width, height, depth, colour_type, _, _, interlace = header
    if depth != 8 or colour_type not in (2, 6) or interlace:
        raise ValueError("only 8-bit, non-interlaced RGB or RGBA PNGs are understood")
    bpp = 3 if colour_type == 2 else 4
    stride = width * bpp
    raw = zlib.decompress(b"".join(idat))
    if len(raw) < height * (stride + 1):
        raise ValueError("PNG image data is shorter than its header says")
    rows, prev = [], bytearray(stride)
    for y in range(height):
        start = y * (stride + 1)
        kind, line = raw[start], bytearray(raw[start + 1 : start + 1 + stride])
        if kind:
            _unfilter(kind, line, prev, bpp)
        rows.append(bytes(line))
        prev = line
    return width, height, bpp, rows


def _unfilter(kind: int, line: bytearray, prev: bytearray, bpp: int) -> None:
    for x in range(len(line)):
        a = line[x - bpp] if x >= bpp else 0
        b = prev[x]
        c = prev[x - bpp] if x >= bpp else 0
        if kind == 1:
            pred = a
        elif kind == 2:
            pred = b
        elif kind == 3:
            pred = (a + b) // 2
        elif kind == 4:
            p = a + b - c
            pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
            pred = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
        else:
            raise ValueError(f"unknown PNG filter type {kind}")
        line[x] = (line[x] + pred) & 0xFF


def colour_name(rgb: Sequence[float]) -> str:
    return min(_PALETTE, key=lambda n: sum((a - b) ** 2 for a, b in zip(rgb, _PALETTE[n], strict=True)))


def half_colours(png: bytes) -> tuple[str, str]:
    """Names of the average colours of the left and right halves of a PNG."""
    width, height, bpp, rows = decode_png(png)
    half = width // 2
    sums = [[0, 0, 0], [0, 0, 0]]
    counts = [0, 0]
    for row in rows:
        for x in range(width):
            side = 0 if x < half else 1
            px = row[x * bpp : x * bpp + 3]
            for i in range(3):
                sums[side][i] += px[i]
            counts[side] += 1
    left, right = ([s / max(n, 1) for s in side] for side, n in zip(sums, counts, strict=True))
    return colour_name(left), colour_name(right)


# --------------------------------------------------------------------------- composing answers


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    return ""


def _images_of(content: Any) -> list[str]:
    if not isinstance(content, list):
        return []
    urls = []
    for part in content:
        if isinstance(part, dict) and part.get("type") == "image_url":
            image = part.get("image_url")
            urls.append(image.get("url", "") if isinstance(image, dict) else str(image))
    return urls


def _words(text: str) -> int:
    return len(text.split())


def _thinking(prompt: str, effort: str) -> str:
    # Deeper effort, longer thinking: the verifier records the token counts of low and max.
    depth = {"low": 1, "high": 3, "max": 6}[effort]
    lines = [f"The user asks: {prompt[:120]!r}."]
    steps = [
        "Work out what is being asked.",
        "Check the facts I need.",
        "Consider whether a tool or an earlier turn helps.",
        "Draft the answer.",
        "Verify the draft against the question.",
        "Trim it to what was asked.",
    ]
    return " ".join(lines + steps[:depth])


def _scripted_answer(prompt: str) -> str:
    lowered = prompt.lower()
    count = re.search(r"count from (\d+) to (\d+)", lowered)
    if count:
        lo, hi = int(count.group(1)), min(int(count.group(2)), 200)
        return " ".join(str(n) for n in range(lo, hi + 1))
    if "who are you" in lowered:
        return "Hello! I am Kimi, an AI assistant developed by Moonshot AI."
    if "split a bill" in lowered:
        return "Cara pays 8.50, Ben pays 11.50 and Ana pays 23.00."
    if "capital of france" in lowered:
        return "The capital of France is Paris."
    return f"(scripted fake) You said: {prompt[:80]}"


def _tool_call_args(name: str, prompt: str) -> dict[str, Any] | None:
    if name == "calculate":
        match = re.search(r"(-?\d+(?:\.\d+)?)\s*([*x×+\-/])\s*(-?\d+(?:\.\d+)?)", prompt)
        if match:
            op = "*" if match.group(2) in "x×" else match.group(2)
            return {"expression": f"{match.group(1)}{op}{match.group(3)}"}
    if name == "get_weather":
        match = re.search(r"weather in ([A-Z][A-Za-z]+)", prompt)
        if match:
            return {"city": match.group(1)}
    return None


def _prior_reasoning(message: dict[str, Any], settings: FakeSettings) -> str:
    if "drop_reasoning" in settings.faults:
        return ""
    for name in settings.accepted_reasoning_fields:
        value = message.get(name)
        if isinstance(value, str) and value:
            return value
    # a server without a reasoning parser sees its thinking inline in content
    inline = re.search(r"<think>(.*?)</think>", message.get("content") or "", re.S)
    return inline.group(1) if inline else ""


def compose_reply(
    messages: list[dict[str, Any]],
    tool_names: Sequence[str],
    effort: str,
    settings: FakeSettings,
) -> Reply:
    """The scripted assistant turn for a conversation; raises HttpError for refused requests."""
    if effort not in EFFORTS:
        raise HttpError(400, f"reasoning_effort must be one of {', '.join(EFFORTS)}, got {effort!r}")
    if not messages:
        raise HttpError(400, "messages must not be empty")
    user_index = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=-1)
    if user_index < 0:
        raise HttpError(400, "no user message")
    prompt = _text_of(messages[user_index].get("content"))
    after_user = messages[user_index + 1 :]
    tool_results = [m for m in after_user if m.get("role") == "tool"]

    if tool_results:
        return _answer_from_tools(after_user, tool_results, prompt, effort, settings)

    images = _images_of(messages[user_index].get("content"))
    if images:
        return _answer_image(images, prompt, effort, settings)

    offered = [n for n in tool_names if _tool_call_args(n, prompt) is not None]
    if offered:
        calls = []
        for index, name in enumerate(offered):
            args = _tool_call_args(name, prompt) or {}
            if "bad_tool_args" in settings.faults:
                arguments = repr(args)  # Python dict syntax: single quotes, not JSON
            else:
                arguments = json.dumps(args)
            calls.append({
                "id": f"functions.{name}:{index}",
                "type": "function",
                "function": {"name": name, "arguments": arguments},
            })
        reasoning = (
            f"{_thinking(prompt, effort)} I will call {' and '.join(offered)} and then combine "
            "their results into one answer."
        )
        return Reply(reasoning=reasoning, content=None, tool_calls=calls)

    remembered = []
    for message in messages[:user_index]:
        if message.get("role") != "assistant":
            continue
        reasoning = _prior_reasoning(message, settings)
        shown = set(re.findall(r"\d+", message.get("content") or ""))
        remembered += [n for n in re.findall(r"\d+", reasoning) if n not in shown and n not in remembered]
    if remembered:
        listed = ", ".join(remembered[:-1]) + (" and " if len(remembered) > 1 else "") + remembered[-1]
        return Reply(
            reasoning=f"{_thinking(prompt, effort)} My earlier reasoning also listed {listed}.",
            content=f"The other {'number was' if len(remembered) == 1 else 'numbers were'} {listed}.",
        )
    if any(m.get("role") == "assistant" for m in messages[:user_index]):
        return Reply(
            reasoning=f"{_thinking(prompt, effort)} I only have what the visible answers said.",
            content="I have nothing beyond what I already told you.",
        )
    return Reply(reasoning=_thinking(prompt, effort), content=_scripted_answer(prompt))


def _answer_from_tools(
    after_user: list[dict[str, Any]],
    tool_results: list[dict[str, Any]],
    prompt: str,
    effort: str,
    settings: FakeSettings,
) -> Reply:
    calls: dict[str, dict[str, Any]] = {}
    turn_reasoning = ""
    for message in after_user:
        if message.get("role") == "assistant":
            for call in message.get("tool_calls") or []:
                calls[call.get("id")] = call
            turn_reasoning += _prior_reasoning(message, settings)
    for result in tool_results:
        if result.get("tool_call_id") not in calls:
            raise HttpError(
                400,
                f"tool message for {result.get('tool_call_id')!r} has no matching tool call in a preceding "
                "assistant turn; send the assistant turn back with its tool_calls",
            )
    if not turn_reasoning:
        # Kimi K3.1 Pro plans the combined answer in the thinking of the tool-call turn;
        # without it the results arrive without their purpose.
        return Reply(
            reasoning=f"{_thinking(prompt, effort)} Tool results arrived but my earlier plan is gone.",
            content="I received some tool results, but I have lost track of what they were for.",
        )
    lines = []
    for result in tool_results:
        call = calls[result["tool_call_id"]]  # present: checked above
        name = call["function"]["name"]
        try:
            payload = json.loads(result.get("content") or "{}")
        except ValueError:
            payload = {"raw": result.get("content")}
        if name == "calculate" and "result" in payload:
            value = payload["result"]
            shown = f"{value:,}" if isinstance(value, int) else str(value)
            try:
                expression = json.loads(call["function"]["arguments"]).get("expression", "the expression")
            except ValueError:
                expression = "the expression"
            lines.append(f"- {expression} = {shown}")
        elif name == "get_weather" and "weather" in payload:
            lines.append(f"- {payload.get('city', 'the city')} weather: {payload['weather']}")
        else:
            lines.append(f"- {name} returned {json.dumps(payload)}")
    return Reply(
        reasoning=f"{_thinking(prompt, effort)} Both tools answered; combine the results.",
        content="Here are the results:\n" + "\n".join(lines),
    )


def _answer_image(images: list[str], prompt: str, effort: str, settings: FakeSettings) -> Reply:
    if "no_image" in settings.faults:
        raise HttpError(400, "image input is not supported by this server (multimodal disabled)")
    url = images[0]
    match = re.match(r"data:image/png;base64,(.+)$", url, re.S)
    if not match:
        raise HttpError(400, "only data:image/png;base64 URIs are understood by the fake server")
    try:
        left, right = half_colours(b64decode(match.group(1), validate=False))
    except (ValueError, zlib.error) as exc:
        raise HttpError(400, f"could not decode the image: {exc}") from exc
    if left == right:
        content = f"The image is a single solid {left} block."
    else:
        content = (
            f"The image shows two solid colour blocks side by side: the left half is {left} "
            f"and the right half is {right}, meeting along a vertical line down the middle."
        )
    return Reply(reasoning=f"{_thinking(prompt, effort)} I look at the two halves.", content=content)


# --------------------------------------------------------------------------- wire shapes


def _message_payload(reply: Reply, settings: FakeSettings) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": reply.content, "tool_calls": reply.tool_calls or None}
    if "no_reasoning" in settings.faults:
        message["content"] = f"<think>{reply.reasoning}</think>{reply.content or ''}"
    else:
        message[settings.reasoning_field] = reply.reasoning
    return message


def _usage(messages: list[dict[str, Any]], reply: Reply) -> dict[str, int]:
    prompt = sum(_words(_text_of(m.get("content"))) for m in messages)
    completion = _words(reply.reasoning) + _words(reply.content or "")
    completion += sum(_words(c["function"]["arguments"]) for c in reply.tool_calls)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _stream_chunks(reply: Reply, settings: FakeSettings, model: str, include_usage: bool,
                   usage: dict[str, int]) -> Iterator[dict[str, Any]]:
    ident, created = "chatcmpl-" + uuid.uuid4().hex, int(time.time())

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {
            "id": ident,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }

    yield chunk({"role": "assistant", "content": ""})
    message = _message_payload(reply, settings)
    reasoning = message.get(settings.reasoning_field) or ""
    for word in re.findall(r"\S+\s*", reasoning):
        yield chunk({settings.reasoning_field: word})
    for word in re.findall(r"\S+\s*", message.get("content") or ""):
        yield chunk({"content": word})
    for index, call in enumerate(reply.tool_calls):
        yield chunk({"tool_calls": [dict(call, index=index)]})
    yield chunk({}, reply.finish_reason)
    if include_usage:
        yield {"id": ident, "object": "chat.completion.chunk", "created": created, "model": model,
               "choices": [], "usage": usage}


def _anthropic_to_openai(body: dict[str, Any]) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    system = body.get("system")
    if system:
        messages.append({"role": "system", "content": _text_of(system) if isinstance(system, list) else system})
    for message in body.get("messages") or []:
        content = message.get("content")
        converted: dict[str, Any] = {"role": message.get("role")}
        if isinstance(content, list):
            parts = []
            for block in content:
                if not isinstance(block, dict):
                    continue
                if block.get("type") == "text":
                    parts.append({"type": "text", "text": block.get("text", "")})
                elif block.get("type") == "image":
                    source = block.get("source") or {}
                    url = f"data:{source.get('media_type', 'image/png')};base64,{source.get('data', '')}"
                    parts.append({"type": "image_url", "image_url": {"url": url}})
                elif block.get("type") == "thinking":
                    converted["reasoning_content"] = block.get("thinking", "")
                    converted["reasoning"] = block.get("thinking", "")
            converted["content"] = parts
        else:
            converted["content"] = content or ""
        messages.append(converted)
    return messages


# --------------------------------------------------------------------------- HTTP server


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    settings: FakeSettings
    stop_event: threading.Event
    served: dict[str, int]
    served_lock: threading.Lock
    verbose: bool = False
    tls: ssl.SSLContext | None = None
    metrics_only: bool = False  # TokenSpeed's Prometheus listener: /metrics and nothing else

    def get_request(self) -> Any:
        sock, address = super().get_request()
        if self.tls is not None:
            # The handshake happens on the handler's thread at its first read, so a slow client stalls no one else.
            sock = self.tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        return sock, address

    def count(self, prompt_tokens: int, completion_tokens: int, streamed: bool = True) -> None:
        """One request served, for /metrics. smg (TokenSpeed) counts tokens of streamed chats and of Anthropic
        messages only; the engines count every request's."""
        with self.served_lock:
            self.served["requests"] += 1
            if streamed or self.settings.engine != "tokenspeed":
                self.served["prompt_tokens"] += prompt_tokens
                self.served["generation_tokens"] += completion_tokens

    def metrics(self) -> str:
        """Prometheus text with the counters each engine exports under its own names (SGLang with
        --enable-metrics: sglang:num_requests_total...; vLLM: vllm:request_success_total...)."""
        with self.served_lock:
            values = (self.served["requests"], self.served["prompt_tokens"], self.served["generation_tokens"])
        model = self.settings.model_ids[0]
        if self.settings.engine == "tokenspeed":
            labels = f'router_type="grpc",backend_type="tokenspeed",model="{model}",endpoint="chat"'
            return (f"# TYPE smg_router_requests_total counter\nsmg_router_requests_total{{{labels}}} {values[0]}\n"
                    "# TYPE smg_router_tokens_total counter\n"
                    f'smg_router_tokens_total{{{labels},token_type="input"}} {values[1]}\n'
                    f'smg_router_tokens_total{{{labels},token_type="output"}} {values[2]}\n')
        names = {"sglang": ("sglang:num_requests_total", "sglang:prompt_tokens_total",
                            "sglang:generation_tokens_total"),
                 "vllm": ("vllm:request_success_total", "vllm:prompt_tokens_total",
                          "vllm:generation_tokens_total")}[self.settings.engine]
        return "".join(f"# TYPE {name} counter\n{name}{{model_name=\"{model}\"}} {float(value)}\n"
                       for name, value in zip(names, values, strict=False))

    def handle_error(self, request: Any, client_address: Any) -> None:
        # a client that gave up (the verifier's timeout) is expected, not worth a traceback
        if self.verbose:
            super().handle_error(request, client_address)


# vLLM's key check covers only these prefixes; everything else it serves is open.
VLLM_GUARDED_PREFIXES = ("/v1", "/v2", "/inference", "/cohere")


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, fmt: str, *args: Any) -> None:
        if self.server.verbose:
            sys.stderr.write("fake-inference: " + (fmt % args) + "\n")

    @property
    def settings(self) -> FakeSettings:
        return self.server.settings

    # ---- plumbing

    def _send_json(self, status: int, payload: Any) -> None:
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)

    def _send_error(self, status: int, message: str) -> None:
        if status == 401:
            self._send_json(401, {"error": "Unauthorized"})
        else:
            kind = {400: "BadRequestError", 404: "NotFoundError", 500: "InternalServerError"}.get(status, "Error")
            self._send_json(status, {"object": "error", "message": message, "type": kind, "code": status})

    def _send_sse(self, events: Iterator[bytes]) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Connection", "close")
        self.end_headers()
        try:
            for event in events:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass

    def _authorized(self, path: str = "/v1") -> bool:
        key = self.settings.api_key
        if not key or "no_auth" in self.settings.faults:
            return True
        if self.settings.engine == "vllm" and not path.startswith(VLLM_GUARDED_PREFIXES):
            return True
        # like SGLang and vLLM: only `Authorization: Bearer <key>` counts
        given = self.headers.get("Authorization", "")
        return hmac.compare_digest(given.encode(), f"Bearer {key}".encode())

    def _read_json(self) -> dict[str, Any]:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            raise HttpError(400, "request body is not JSON") from None
        if not isinstance(body, dict):
            raise HttpError(400, "request body must be a JSON object")
        return body

    def _generation_preamble(self, body: dict[str, Any]) -> str:
        model = body.get("model")
        if model not in self.settings.model_ids:
            raise HttpError(404, f"The model `{model}` does not exist.")
        if "slow" in self.settings.faults:
            self.server.stop_event.wait(self.settings.slow_seconds)
        if "server_error" in self.settings.faults:
            raise HttpError(500, "Internal server error: CUDA error: an illegal memory access was encountered")
        return model

    # ---- routes

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if self.server.metrics_only and path != "/metrics":
            return self._send_json(404, {"detail": "Not Found"})
        if path in ("/health", "/health_generate", "/ping") or (self.settings.engine == "tokenspeed"
                                                                and path in ("/readiness", "/liveness")):
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.send_header("Connection", "close")
            self.end_headers()
            return
        if path == "/metrics" and (self.settings.engine != "tokenspeed" or self.server.metrics_only):
            # as vLLM serves it: its --api-key guards only the /v1 paths (same here for SGLang); smg on its own port
            data = self.server.metrics().encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        if not self._authorized(path):
            return self._send_error(401, "Unauthorized")
        if path == "/v1/models":
            created = int(time.time())
            return self._send_json(200, {
                "object": "list",
                "data": [
                    {
                        "id": name,
                        "object": "model",
                        "created": created,
                        "owned_by": self.settings.engine,
                        "root": name,
                        "parent": None,
                        "max_model_len": self.settings.max_model_len,
                    }
                    for name in self.settings.model_ids
                ],
            })
        self._send_json(404, {"detail": "Not Found"})

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0]
        if self.server.metrics_only:
            return self._send_json(404, {"detail": "Not Found"})
        try:
            if not self._authorized(path):
                raise HttpError(401, "Unauthorized")
            body = self._read_json()
            if path == "/v1/chat/completions":
                return self._chat(body)
            if path == "/v1/messages":
                return self._messages(body)
            if self.settings.engine == "vllm" and path == "/invocations":
                # SageMaker's route: a chat completion body is served as one, with no key.
                return self._chat(body)
            if self.settings.engine == "vllm" and path == "/tokenize":
                text = body.get("prompt") or " ".join(_text_of(m.get("content")) for m in body.get("messages") or [])
                tokens = list(range(_words(str(text))))
                return self._send_json(200, {"count": len(tokens), "max_model_len": self.settings.max_model_len,
                                             "tokens": tokens})
            raise HttpError(404, "Not Found")
        except HttpError as exc:
            try:
                self._send_error(exc.status, exc.message)
            except (BrokenPipeError, ConnectionResetError):
                pass
        except (BrokenPipeError, ConnectionResetError):
            pass

    def _chat(self, body: dict[str, Any]) -> None:
        model = self._generation_preamble(body)
        messages = body.get("messages")
        if not isinstance(messages, list):
            raise HttpError(400, "messages must be a list")
        tool_names = [t.get("function", {}).get("name") for t in body.get("tools") or [] if isinstance(t, dict)]
        reply = compose_reply(messages, tool_names, body.get("reasoning_effort", "max"), self.settings)
        usage = _usage(messages, reply)
        self.server.count(usage["prompt_tokens"], usage["completion_tokens"], streamed=bool(body.get("stream")))
        if body.get("stream"):
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            chunks = _stream_chunks(reply, self.settings, model, include_usage, usage)
            events = (self._paced(b"data: " + json.dumps(c).encode() + b"\n\n") for c in chunks)
            return self._send_sse(_then_done(events))
        self.server.stop_event.wait(self.settings.token_seconds * usage["completion_tokens"])
        self._send_json(200, {
            "id": "chatcmpl-" + uuid.uuid4().hex,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": [{"index": 0, "message": _message_payload(reply, self.settings),
                         "finish_reason": reply.finish_reason}],
            "usage": usage,
        })

    def _paced(self, event: bytes) -> bytes:
        """One SSE event, after one token's decode time."""
        if self.settings.token_seconds:
            self.server.stop_event.wait(self.settings.token_seconds)
        return event

    def _messages(self, body: dict[str, Any]) -> None:
        model = self._generation_preamble(body)
        if not isinstance(body.get("messages"), list) or not body.get("max_tokens"):
            raise HttpError(400, "messages (a list) and max_tokens are required")
        messages = _anthropic_to_openai(body)
        effort = body.get("reasoning_effort") or (body.get("output_config") or {}).get("effort") or "high"
        reply = compose_reply(messages, [], effort, self.settings)
        usage = _usage(messages, reply)
        self.server.count(usage["prompt_tokens"], usage["completion_tokens"])
        blocks: list[dict[str, Any]] = []
        text = reply.content or ""
        if "no_reasoning" in self.settings.faults:
            text = f"<think>{reply.reasoning}</think>{text}"
        else:
            blocks.append({"type": "thinking", "thinking": reply.reasoning, "signature": ""})
        blocks.append({"type": "text", "text": text})
        message = {
            "id": "msg_" + uuid.uuid4().hex,
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": blocks,
            "stop_reason": "end_turn",
            "stop_sequence": None,
            "usage": {"input_tokens": usage["prompt_tokens"], "output_tokens": usage["completion_tokens"]},
        }
        if body.get("stream"):
            return self._send_sse(_anthropic_events(message))
        self._send_json(200, message)


def _then_done(events: Iterator[bytes]) -> Iterator[bytes]:
    yield from events
    yield b"data: [DONE]\n\n"


def _anthropic_events(message: dict[str, Any]) -> Iterator[bytes]:
    def event(name: str, data: dict[str, Any]) -> bytes:
        return f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()

    start = dict(message, content=[], stop_reason=None)
    yield event("message_start", {"type": "message_start", "message": start})
    for index, block in enumerate(message["content"]):
        if block["type"] == "thinking":
            empty = {"type": "thinking", "thinking": ""}
            delta = {"type": "thinking_delta", "thinking": block["thinking"]}
        else:
            empty, delta = {"type": "text", "text": ""}, {"type": "text_delta", "text": block["text"]}
        yield event("content_block_start", {"type": "content_block_start", "index": index, "content_block": empty})
        yield event("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})
        yield event("content_block_stop", {"type": "content_block_stop", "index": index})
    yield event("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn"},
                                  "usage": {"output_tokens": message["usage"]["output_tokens"]}})
    yield event("message_stop", {"type": "message_stop"})


class FakeInferenceServer:
    """The fake on a background thread: `with FakeInferenceServer(settings) as fake: fake.url`."""

    def __init__(self, settings: FakeSettings, host: str = "127.0.0.1", port: int = 0, verbose: bool = False,
                 tls: tuple[str, str] | None = None, ca_certificate: str | None = None,
                 metrics_address: tuple[str, int] | None = None) -> None:
        """`tls` (certificate chain file, key file) serves https; `ca_certificate` is the PEM a client should trust;
        `metrics_address` is TokenSpeed's Prometheus listener (its shape only: the engines serve /metrics inline)."""
        self.settings = settings
        self.ca_certificate = ca_certificate
        self.httpd = _Server((host, port), _Handler)
        if tls is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(*tls)
            self.httpd.tls = context
        self.httpd.settings = settings
        self.httpd.stop_event = threading.Event()
        self.httpd.served = {"requests": 0, "prompt_tokens": 0, "generation_tokens": 0}
        self.httpd.served_lock = threading.Lock()
        self.httpd.verbose = verbose
        self._thread: threading.Thread | None = None
        self.metrics_httpd: _Server | None = None
        if settings.engine == "tokenspeed":
            # smg binds a Prometheus listener of its own (a free port unless --prometheus-port pins one).
            self.metrics_httpd = _Server(metrics_address or (host, 0), _Handler)
            for name in ("settings", "stop_event", "served", "served_lock", "verbose"):
                setattr(self.metrics_httpd, name, getattr(self.httpd, name))
            self.metrics_httpd.metrics_only = True
        self._metrics_thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return self.httpd.server_address[1]

    @property
    def metrics_url(self) -> str | None:
        if self.metrics_httpd is None:
            return None
        return f"http://127.0.0.1:{self.metrics_httpd.server_address[1]}"

    @property
    def url(self) -> str:
        host = str(self.httpd.server_address[0])
        scheme = "https" if self.httpd.tls is not None else "http"
        return f"{scheme}://{'127.0.0.1' if host in ('0.0.0.0', '') else host}:{self.port}"

    def start(self) -> FakeInferenceServer:
        # a short poll keeps stop() quick, which matters when tests start dozens of servers
        self._thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, name="fake-inference", daemon=True
        )
        self._thread.start()
        if self.metrics_httpd is not None:
            self._metrics_thread = threading.Thread(target=self.metrics_httpd.serve_forever,
                                                    kwargs={"poll_interval": 0.05}, name="fake-metrics", daemon=True)
            self._metrics_thread.start()
        return self

    def stop(self) -> None:
        self.httpd.stop_event.set()  # wakes handlers sleeping in the "slow" fault
        self.httpd.shutdown()
        self.httpd.server_close()
        if self._thread:
            self._thread.join(timeout=5)
        if self.metrics_httpd is not None:
            if self._metrics_thread:
                self.metrics_httpd.shutdown()
                self._metrics_thread.join(timeout=5)
            self.metrics_httpd.server_close()

    def __enter__(self) -> FakeInferenceServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


# --------------------------------------------------------------------------- command line


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m kimi_cluster.fakes.inference_server",
        # an engine flag the fake does not know must never be read as an abbreviation of one it does
        allow_abbrev=False,
        description="Fake SGLang/vLLM server for Kimi K3.1 Pro. Unknown engine flags are ignored. "
        "A leading positional model (as `vllm serve MODEL` or the vllm-openai image takes it) implies --engine vllm.",
    )
    parser.add_argument("--engine", choices=ENGINES, help="answer shape; guessed from the flags if omitted")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--listen", action="append", default=[], metavar="HOST:PORT",
                        help="serve on these addresses instead of --host/--port (repeatable); a container's port "
                        "published on several host addresses is one server on each")
    parser.add_argument("--served-model-name", nargs="+", help="model id(s) to serve (SGLang takes one)")
    parser.add_argument("--model-path", help="SGLang's model flag")
    parser.add_argument("--model", dest="model_flag", help="vLLM's --model flag")
    parser.add_argument("--api-key-file", help="file holding the API key (preferred over --api-key)")
    parser.add_argument("--api-key", help="API key; argv is visible in ps, prefer --api-key-file or KIMI_API_KEY")
    parser.add_argument("--context-length", type=int, help="SGLang's context length, reported as max_model_len")
    parser.add_argument("--max-model-len", type=int, help="vLLM's context length")
    parser.add_argument("--node-rank", type=int, default=0,
                        help="SGLang rank; ranks above 0 serve no HTTP API, so the fake only idles")
    parser.add_argument("--tp-size", "--tp", "--tensor-parallel-size", dest="tp", type=int,
                        help="ignored; declared so its value is not taken for the positional model")
    parser.add_argument("--prometheus-host", default="0.0.0.0", help="TokenSpeed's (smg's) metrics listener")
    parser.add_argument("--prometheus-port", type=int, default=None,
                        help="TokenSpeed's metrics port; a free one when not given, as `tokenspeed serve` picks")
    parser.add_argument("--load-format", default="auto",
                        help="the engines' loader; 'dummy' (random weights) compiles the same kernels, as they do")
    parser.add_argument("--compile-only", action="store_true",
                        help="compile the kernels, then exit 0 without serving (SGLang's compile_deep_gemm)")
    parser.add_argument("--fault", action="append", default=[],
                        help="break the server on purpose (repeatable or comma list): " + ", ".join(FAULTS))
    parser.add_argument("--slow-seconds", type=float, default=30.0, help="delay of the 'slow' fault")
    parser.add_argument("--verbose", action="store_true", help="log each request to stderr")
    return parser


def _read_key(args: argparse.Namespace) -> str | None:
    if args.api_key_file:
        with open(args.api_key_file, encoding="utf-8") as handle:
            key = handle.read().strip()
        if not key:
            raise SystemExit(f"--api-key-file {args.api_key_file} is empty")
        return key
    return args.api_key or os.environ.get("KIMI_API_KEY") or os.environ.get("VLLM_API_KEY") or None


def settings_from_args(argv: Sequence[str] | None = None) -> tuple[FakeSettings, argparse.Namespace, list[str]]:
    """Parse real-engine style flags into settings; returns the ignored flags too."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["serve"]:
        argv = argv[1:]
    # Only a leading bare word is the model: later ones are values of engine flags the fake ignores
    # (`--nnodes 4`), which argparse cannot tell from positionals.
    positional = argv.pop(0) if argv and not argv[0].startswith("-") else None
    args, ignored = _parser().parse_known_args(argv)
    engine = args.engine or ("vllm" if (positional or args.model_flag or args.max_model_len) else "sglang")
    names = tuple(args.served_model_name or [positional or args.model_flag or args.model_path or DEFAULT_MODEL])
    faults = frozenset(f.strip() for raw in args.fault for f in raw.split(",") if f.strip())
    settings = FakeSettings(
        engine=engine,
        served_model_names=names,
        api_key=_read_key(args),
        max_model_len=args.context_length or args.max_model_len or FakeSettings.max_model_len,
        faults=faults,
        slow_seconds=args.slow_seconds,
        token_seconds=float(os.environ.get("FAKE_ENGINE_TOKEN_SECONDS") or 0),
    )
    return settings, args, ignored


# --------------------------------------------------------------------------- kernel warm-up

# Flags that decide which kernels a real engine compiles (the same idea as kimi_cluster/plan/kernel_cache_key.py).
_SHAPE_FLAGS = ("--ep-size", "--moe-runner-backend", "--quantization", "--kv-cache-dtype", "--attention-backend",
                "--dtype", "--enable-expert-parallel", "--data-parallel-size", "--decode-context-parallel-size",
                "--mm-encoder-tp-mode", "--moe-backend")


def kernel_files(engine: str, args: argparse.Namespace, ignored: Sequence[str], env: dict[str, str]) -> list[str]:
    """The files a warm-up leaves, in the folders the engine's environment names; none without those variables.

    SGLang sets DG_JIT_CACHE_DIR from SGLANG_DG_CACHE_DIR (default ~/.cache/sglang/deep_gemm) whatever the
    environment says; vLLM keeps its torch.compile artifacts under VLLM_CACHE_ROOT.
    """
    shape = [engine, f"tp={args.tp}", f"len={args.context_length or args.max_model_len}"]
    words = list(ignored)
    for i, word in enumerate(words):
        name = word.partition("=")[0]
        if name in _SHAPE_FLAGS:
            value = word.partition("=")[2] or (words[i + 1] if i + 1 < len(words) else "")
            shape.append(f"{name}={value}")
    h = hashlib.sha256(" ".join(shape).encode()).hexdigest()[:16]
    out = []
    if env.get("TRITON_CACHE_DIR"):
        out += [f"{env['TRITON_CACHE_DIR']}/{h}moe/fused_moe_kernel.cubin",
                f"{env['TRITON_CACHE_DIR']}/{h}moe/fused_moe_kernel.json",
                f"{env['TRITON_CACHE_DIR']}/{h}att/decode_attention_fwd.cubin"]
    if env.get("TORCHINDUCTOR_CACHE_DIR"):
        out.append(f"{env['TORCHINDUCTOR_CACHE_DIR']}/fxgraph/{h[:2]}/f{h}/graph")
    if engine == "sglang":
        dg = env.get("SGLANG_DG_CACHE_DIR") or (f"{env['XDG_CACHE_HOME']}/sglang/deep_gemm"
                                                 if env.get("XDG_CACHE_HOME") else "")
    else:
        dg = env.get("DG_JIT_CACHE_DIR", "")
    if dg:
        out.append(f"{dg}/cache/kernel.fp8_gemm.{h}/kernel.cubin")
    if engine == "vllm" and env.get("VLLM_CACHE_ROOT"):
        out.append(f"{env['VLLM_CACHE_ROOT']}/torch_compile_cache/{h}/rank_0_0/backbone/artifact")
    if engine == "tokenspeed":
        # tokenspeed-kernel 0.1.4: ops/tuning.py (<root>/<digest>/autotune_configs.json), thirdparty/msa/jit.py
        if env.get("TOKENSPEED_FLASHINFER_AUTOTUNE_CACHE_DIR"):
            out.append(f"{env['TOKENSPEED_FLASHINFER_AUTOTUNE_CACHE_DIR']}/{h[:24]}/autotune_configs.json")
        if env.get("MINFER_FMHA_CACHE_DIR"):
            out.append(f"{env['MINFER_FMHA_CACHE_DIR']}/{h}/fmha_kernel.so")
    return out


def warm_up(engine: str, args: argparse.Namespace, ignored: Sequence[str], env: dict[str, str],
            compile_seconds: float, stop: threading.Event) -> None:
    """As a real engine's start: kernels missing from the cache are compiled (slowly), present ones are loaded."""
    files = kernel_files(engine, args, ignored, env)
    if not files:
        return
    missing = [f for f in files if not os.path.exists(f)]
    if not missing:
        print(f"fake-inference: all {len(files)} kernels found in the cache; no compile", file=sys.stderr,
              flush=True)
        return
    seconds = compile_seconds * len(missing) / len(files)
    weights = "random weights (--load-format dummy)" if args.load_format == "dummy" else "the checkpoint"
    print(f"fake-inference: compiling {len(missing)} of {len(files)} kernels ({seconds:.1f} s; the cache had "
          f"{len(files) - len(missing)}) on {weights}", file=sys.stderr, flush=True)
    if stop.wait(seconds):
        # Stopped mid-compile, as `docker rm -f` stops a warm-up: nothing half-built is left in the cache.
        print("fake-inference: stopped while compiling; nothing written", file=sys.stderr, flush=True)
        return
    for path in missing:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        seed = hashlib.sha256(os.path.basename(path).encode()).digest()
        with open(path + ".tmp", "wb") as fh:
            fh.write(b"\x7fELF fake kernel " + seed * 256)
        os.replace(path + ".tmp", path)
    print(f"fake-inference: compiled {len(missing)} kernels", file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    try:
        settings, args, ignored = settings_from_args(argv)
    except ValueError as exc:
        print(f"fake-inference: {exc}", file=sys.stderr)
        return 2
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    warm_up(settings.engine, args, ignored, dict(os.environ),
            float(os.environ.get("FAKE_ENGINE_COMPILE_SECONDS") or 0), stop)
    if args.compile_only:
        if stop.is_set():
            return 128 + signal.SIGTERM  # as a process ended by SIGTERM reports it
        print("fake-inference: kernels compiled; exiting (compile only)", file=sys.stderr, flush=True)
        return 0
    if args.node_rank > 0:
        print(f"fake-inference: rank {args.node_rank} serves no HTTP API (as SGLang); idling", file=sys.stderr)
        while not stop.wait(1.0):
            pass
        return 0
    try:
        addresses = [_address(a) for a in args.listen] or [(args.host, args.port)]
        # One metrics listener for the gateway (TokenSpeed), beside its first API address.
        metrics = (args.prometheus_host, args.prometheus_port or 0)
        servers = [FakeInferenceServer(settings, host, port, verbose=args.verbose,
                                       metrics_address=metrics if i == 0 else None)
                   for i, (host, port) in enumerate(addresses)]
    except (OSError, ValueError) as exc:
        print(f"fake-inference: cannot listen: {exc}", file=sys.stderr)
        return 1
    where = ", ".join(f"{host}:{server.port}" for (host, _), server in zip(addresses, servers, strict=True))
    print(
        f"fake-inference: {settings.engine} shape on {where} serving "
        f"{list(settings.model_ids)}; key {'required' if settings.api_key else 'NOT set (open)'}; "
        f"faults {sorted(settings.faults) or 'none'}"
        + (f"; ignored flags {ignored}" if ignored else ""),
        file=sys.stderr,
        flush=True,
    )
    for server in servers:
        server.start()
    try:
        while not stop.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        for server in servers:
            server.stop()
    return 0


def _address(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"--listen expects HOST:PORT, got {text!r}")
    return host, int(port)


if __name__ == "__main__":
    sys.exit(main())
