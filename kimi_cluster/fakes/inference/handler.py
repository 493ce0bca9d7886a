"""The fake's HTTP side in the engine's shape: its server (with the counters /metrics shows) and its routes: health,
metrics, models, chat completions, messages, vLLM's token door /inference/v1/generate (generate.py), and vLLM's
/invocations and /tokenize, open without the key."""

from __future__ import annotations

import hmac
import json
import ssl
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from . import generate, sglang_door
from .compose import compose_reply, text_of, words
from .group import HEALTH_TIMEOUT_S, Group
from .settings import DEFAULT_EFFORT, FakeSettings, HttpError
from .wire import anthropic_events, anthropic_to_openai, message_payload, stream_chunks, then_done, token_usage


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    settings: FakeSettings
    stop_event: threading.Event
    served: dict[str, int]
    served_lock: threading.Lock
    verbose: bool = False
    tls: ssl.SSLContext | None = None
    metrics_only: bool = False  # TokenSpeed's Prometheus listener: /metrics and nothing else
    group: Group | None = None  # SGLang's multi-node process group (group.py): hung once a rank is lost

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


class Stopped(Exception):
    """The server stopped while an answer was being decoded."""


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Server

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
            kind = {400: "BadRequestError", 403: "PermissionDeniedError", 404: "NotFoundError",
                    422: "UnprocessableEntityError", 500: "InternalServerError"}.get(status, "Error")
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
        except Stopped:
            self.close_connection = True  # no last chunk: the stream ends unfinished, as a killed engine's does
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
        if self.server.group is not None and self.server.group.hung():
            self.server.group.stall(self.server.stop_event)  # the forward waits for the lost rank's collective
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
            hung = self.server.group is not None and self.server.group.hung()
            if hung:
                # SGLang's head sends a one-token generate and gives up after SGLANG_HEALTH_CHECK_TIMEOUT.
                self.server.stop_event.wait(HEALTH_TIMEOUT_S)
            self.send_response(503 if hung else 200)
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
            if self.settings.engine == "vllm" and path == generate.PATH:
                if not self.settings.scale_out:  # vLLM's own answer without the flag
                    raise HttpError(403, "Scale-out endpoints are disabled. Restart vllm serve with "
                                         "--enable-scale-out to enable them.")
                return self._generate(body)
            if self.settings.engine == "sglang" and path in (sglang_door.PATH, *sglang_door.TOKENIZE_PATHS):
                return self._sglang_door(path, body)
            if self.settings.engine == "vllm" and path == "/invocations":
                # SageMaker's route: a chat completion body is served as one, with no key.
                return self._chat(body)
            if self.settings.engine == "vllm" and path == "/tokenize":
                text = body.get("prompt") or " ".join(text_of(m.get("content")) for m in body.get("messages") or [])
                tokens = list(range(words(str(text))))
                return self._send_json(200, {"count": len(tokens), "max_model_len": self.settings.max_model_len,
                                             "tokens": tokens})
            raise HttpError(404, "Not Found")
        except sglang_door.ContractError as exc:
            self._send_json(400, {"error": exc.message})
        except HttpError as exc:
            try:
                self._send_error(exc.status, exc.message)
            except (BrokenPipeError, ConnectionResetError):
                pass
        except Stopped:
            self.close_connection = True  # nothing more is written: the client sees the answer end unfinished
        except (BrokenPipeError, ConnectionResetError):
            pass

    def _chat(self, body: dict[str, Any]) -> None:
        model = self._generation_preamble(body)
        messages = body.get("messages")
        if not isinstance(messages, list):
            raise HttpError(400, "messages must be a list")
        tool_names = [t.get("function", {}).get("name") for t in body.get("tools") or [] if isinstance(t, dict)]
        reply = compose_reply(messages, tool_names, body.get("reasoning_effort") or DEFAULT_EFFORT,
                              self.settings)
        usage = token_usage(messages, reply)
        self.server.count(usage["prompt_tokens"], usage["completion_tokens"], streamed=bool(body.get("stream")))
        if body.get("stream"):
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            chunks = stream_chunks(reply, self.settings, model, include_usage, usage)
            events = (self._paced(b"data: " + json.dumps(c).encode() + b"\n\n") for c in chunks)
            return self._send_sse(then_done(events))
        self._decode(self.settings.token_seconds * usage["completion_tokens"])
        self._send_json(200, {
            "id": "chatcmpl-" + uuid.uuid4().hex,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": [{"index": 0, "message": message_payload(reply, self.settings),
                         "finish_reason": reply.finish_reason}],
            "usage": usage,
        })

    def _generate(self, body: dict[str, Any]) -> None:
        """vLLM's token door: the tokens that carry on from the prompt (generate.py), streamed or whole."""
        if body.get("model") is not None and body["model"] not in self.settings.model_ids:
            raise HttpError(404, f"The model `{body['model']}` does not exist.")
        if "server_error" in self.settings.faults:
            raise HttpError(500, "Internal server error: CUDA error: an illegal memory access was encountered")
        _, _, stream, _ = generate.request_fields(body)
        if not stream:
            answer = generate.whole(body, self.settings)
            self.server.count(answer["usage"]["prompt_tokens"], answer["usage"]["completion_tokens"], False)
            self._decode(self.settings.token_seconds * answer["usage"]["completion_tokens"])
            return self._send_json(200, answer)
        chunks = list(generate.stream_events(body, self.settings))
        made = sum(len(c["choices"][0]["token_ids"]) for c in chunks if c["choices"])
        self.server.count(len(body["token_ids"]), made)
        events = (self._paced(b"data: " + json.dumps(c).encode() + b"\n\n") for c in chunks)
        return self._send_sse(then_done(events))

    def _sglang_door(self, path: str, body: dict[str, Any]) -> None:
        """SGLang's token door (sglang_door.py): /generate, streamed or whole, and /v1/tokenize."""
        if path != sglang_door.PATH:
            return self._send_json(200, sglang_door.tokenize(body, self.settings))
        if "server_error" in self.settings.faults:
            raise HttpError(500, "Internal server error: CUDA error: an illegal memory access was encountered")
        _, _, stream, _ = sglang_door.request_fields(body)
        if not stream:
            answer = sglang_door.whole(body, self.settings)
            made = answer["meta_info"]["completion_tokens"]
            self.server.count(answer["meta_info"]["prompt_tokens"], made, False)
            self._decode(self.settings.token_seconds * made)
            return self._send_json(200, answer)
        events = list(sglang_door.stream_events(body, self.settings))
        self.server.count(len(body["input_ids"]), len(events))
        return self._send_sse(then_done(self._paced(b"data: " + json.dumps(e).encode() + b"\n\n") for e in events))

    def _paced(self, event: bytes) -> bytes:
        """One SSE event, after one token's decode time."""
        if self.settings.token_seconds:
            self._decode(self.settings.token_seconds)
        return event

    def _decode(self, seconds: float) -> None:
        """The decode time of some tokens. A server stopped meanwhile (SIGTERM, a test's stop) does not finish the
        answer at once, which no engine does: the answer is abandoned, its connection closed unfinished."""
        if self.server.stop_event.wait(seconds):
            raise Stopped()

    def _messages(self, body: dict[str, Any]) -> None:
        model = self._generation_preamble(body)
        if not isinstance(body.get("messages"), list) or not body.get("max_tokens"):
            raise HttpError(400, "messages (a list) and max_tokens are required")
        messages = anthropic_to_openai(body)
        effort = body.get("reasoning_effort") or (body.get("output_config") or {}).get("effort") or DEFAULT_EFFORT
        reply = compose_reply(messages, [], effort, self.settings)
        usage = token_usage(messages, reply)
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
            return self._send_sse(anthropic_events(message))
        self._send_json(200, message)
