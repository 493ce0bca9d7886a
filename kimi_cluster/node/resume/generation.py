"""One generation across replicas: token chunks from `/inference/v1/generate`, resumed on the twin when lost.

The request is vLLM's GenerateRequest as `/v1/chat/completions/render` made it (vLLM 0.33.0,
vllm/entrypoints/scale_out/token_in_token_out/protocol.py). Every token a chunk brings is kept. When the replica is
lost (a reset, an end before a finish, or silence beyond `silence_s` while its health check fails), the same
request goes to another replica with the prompt plus those tokens as its `token_ids` and `max_tokens` (and
`min_tokens`) lowered by their count, which is NVIDIA Dynamo's request migration (ai-dynamo/dynamo,
lib/llm/src/migration.rs) over vLLM's token-level door. A continuation from the exact prefix is a valid sample of
the same request, so nothing is repeated and nothing is missing. The usage the caller sees counts the original prompt
and every generated token, wherever each was made.

A replica's HTTP answer, whatever its status, is the request's answer (`UpstreamError`): it is passed on, the replica
stays in the pool, and nothing is sent again. An error event inside the stream is the same unless the engine died:
vLLM 0.33.0 streams `{"error": {..., "code": 500}}` then `[DONE]` both for a request's own failure (a GenerationError)
and for a dead engine (EngineDeadError, whose server then answers `/health` 503 and shuts down:
vllm/entrypoints/scale_out/token_in_token_out/serving.py, vllm/entrypoints/serve/exception_handling/). So an error
event with a 5xx code is followed by one health check of that replica at once: failed, the replica is lost and the
generation carries on elsewhere; passed, the event is the client's answer.
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from typing import Any

from . import wire
from .pool import Pool, Replica, log

GENERATE_PATH = "/inference/v1/generate"
SGLANG_GENERATE_PATH = "/generate"


class Door:
    """vLLM's token door: GenerateRequest in (`token_ids`, `sampling_params.max_tokens`), token chunks out, the usage
    chunk from the engine."""

    path = GENERATE_PATH
    usage_from_engine = True

    def prompt(self, request: dict[str, Any]) -> list[int]:
        return list(request["token_ids"])

    def max_tokens(self, request: dict[str, Any]) -> int | None:
        return request["sampling_params"].get("max_tokens")

    def carry_on(self, body: dict[str, Any], prompt: list[int], made: int) -> None:
        """Make `body` (a copy of the request) carry on after `made` tokens, `prompt` holding them."""
        body["token_ids"] = prompt
        params = body["sampling_params"]
        if params.get("max_tokens") is not None:
            params["max_tokens"] -= made
        if params.get("min_tokens"):
            params["min_tokens"] = max(0, params["min_tokens"] - made)

    def chunk(self, chunk: dict[str, Any], _from_here: int) -> dict[str, Any]:
        return chunk


class SglangDoor(Door):
    """SGLang 0.5.23's `/generate` (sglang/api/v1/api_types.py GenerateRequest, GenerateResponse): `input_ids` and
    `sampling_params.max_new_tokens` in; `output_ids` out, cumulative by default and disjoint deltas under
    `--incremental-streaming-output`, the finish in `meta_info.finish_reason` (`{"type": "stop", "matched": ...}`),
    no usage chunk. Chunks are handed on in vLLM's shape, with SGLang's finish beside it (`sglang_finish`)."""

    path = SGLANG_GENERATE_PATH
    usage_from_engine = False

    def prompt(self, request: dict[str, Any]) -> list[int]:
        return list(request["input_ids"])

    def max_tokens(self, request: dict[str, Any]) -> int | None:
        return request["sampling_params"].get("max_new_tokens")

    def carry_on(self, body: dict[str, Any], prompt: list[int], made: int) -> None:
        body["input_ids"] = prompt
        params = body["sampling_params"]
        if params.get("max_new_tokens") is not None:
            params["max_new_tokens"] -= made
        if params.get("min_new_tokens"):
            params["min_new_tokens"] = max(0, params["min_new_tokens"] - made)

    def chunk(self, chunk: dict[str, Any], from_here: int) -> dict[str, Any]:
        meta = chunk.get("meta_info") or {}
        ids = chunk.get("output_ids") or []
        if meta.get("completion_tokens") == len(ids):  # cumulative (the first chunk reads the same either way)
            ids = ids[from_here:]
        finish = meta.get("finish_reason")
        kind = finish.get("type") if isinstance(finish, dict) else None
        return {"request_id": meta.get("id", ""), "choices": [{"index": 0, "token_ids": ids, "finish_reason": kind,
                                                               "sglang_finish": finish}]}


VLLM_DOOR, SGLANG_DOOR = Door(), SglangDoor()


@dataclass(frozen=True)
class Limits:
    """How long to wait for what. `silence_s`: the longest a stream may pause while its replica's health check
    fails before it counts as lost (a stream whose replica answers its health checks may pause as long as it likes:
    a long prefill is not a loss). `tick_s`: how often a waiting caller hears of it (its keep-alives). `pick_s`: how
    long to wait for a healthy replica. `resumes`: how many losses one request survives."""

    silence_s: float = 2.0
    tick_s: float = 0.5
    pick_s: float = 15.0
    resumes: int = 3
    connect_s: float = 2.0


class Unavailable(Exception):
    """No replica could carry the request on; the message says why."""


class UpstreamError(Exception):
    """The replica answered the request with an error (an HTTP status, or an error event from an engine that still
    passes its health check): its answer is the client's answer, as it would be without this layer."""

    def __init__(self, status: int, body: bytes) -> None:
        super().__init__(f"HTTP {status}")
        self.status, self.body = status, body


class NoTokenApi(UpstreamError):
    """The replica does not serve the token API (403: `vllm serve` without --enable-scale-out, as a replica not yet
    restarted by an upgrade runs; 404: no such route): the request can still go to its chat endpoint as it is."""


@dataclass
class Resume:
    """One loss survived: where, why, after how many tokens, and how long the stream waited for its next tokens."""

    lost: str
    why: str
    at_token: int
    to: str = ""
    gap_s: float | None = None


@dataclass
class Generation:
    pool: Pool
    request: dict[str, Any]
    limits: Limits = field(default_factory=Limits)
    on_wait: Callable[[float], None] = lambda _quiet_s: None  # told every tick_s while the stream waits
    output: list[int] = field(default_factory=list)
    resumes: list[Resume] = field(default_factory=list)
    finished: str | None = None
    lost_at: float = 0.0
    door: Door = VLLM_DOOR
    # Asked before a lost generation carries on, with every token so far: what the continuation must change besides
    # its prompt and its budget (SGLang's `require_reasoning`), or Unavailable when it cannot carry on exactly.
    before_resume: Callable[[list[int]], dict[str, Any]] = lambda _output: {}

    def __post_init__(self) -> None:
        self.prompt = self.door.prompt(self.request)
        self.max_tokens = self.door.max_tokens(self.request)

    def continuation(self) -> dict[str, Any]:
        """The request that carries on from what was generated so far."""
        body = copy.deepcopy(self.request)
        if not self.output:
            return body
        self.door.carry_on(body, self.prompt + self.output, len(self.output))
        body.update(self.before_resume(self.output))
        body["request_id"] = f"{self.request.get('request_id', 'kimi')}-resume{len(self.resumes)}"
        if "rid" in body:  # SGLang's id: a resumed request is a new one on its engine
            body["rid"] = f"{self.request['rid']}-resume{len(self.resumes)}"
        return body

    def chunks(self) -> Generator[dict[str, Any], None, None]:
        """Every generate stream chunk of the whole generation, in order, the usage chunk last (if asked for)."""
        tried: tuple[Replica, ...] = ()
        while True:
            left = None if self.max_tokens is None else self.max_tokens - len(self.output)
            if left is not None and left <= 0:
                # Every token arrived but the chunk saying so did not: the finish it would have carried.
                yield {"request_id": self.request.get("request_id", ""),
                       "choices": [{"index": 0, "token_ids": [], "finish_reason": "length"}]}
                yield self._usage()
                return
            replica = self._pick(tried)
            tried = (*tried, replica)
            with self.pool.holding(replica, generating=True):
                try:
                    yield from self._stream(replica)
                    return
                except wire.Lost as exc:
                    self._lost(replica, str(exc))
                    if self.finished is not None:  # lost after its finish: only the usage chunk is missing
                        yield self._usage()
                        return

    def _pick(self, tried: tuple[Replica, ...]) -> Replica:
        if len(self.resumes) > self.limits.resumes:
            raise Unavailable(f"lost {len(self.resumes)} replicas during this request")
        # A replica already tried is taken again only once its health check passes (pick skips the unhealthy).
        started = time.monotonic()
        while True:
            replica = self.pool.pick(wait_s=min(self.limits.tick_s, self.limits.pick_s))
            if replica is not None:
                if self.resumes and self.resumes[-1].to == "":
                    self.resumes[-1].to = replica.url
                return replica
            waited = time.monotonic() - started
            if waited >= self.limits.pick_s:
                raise Unavailable(f"no replica is healthy after {waited:.0f} s"
                                  + (f" (tried {', '.join(r.url for r in tried)})" if tried else ""))
            self.on_wait(waited)

    def _lost(self, replica: Replica, why: str) -> None:
        self.pool.mark_lost(replica, why)
        self.resumes.append(Resume(replica.url, why, len(self.output)))
        self.lost_at = time.monotonic()
        log(f"request {self.request.get('request_id', '?')}: lost {replica.url} after {len(self.output)} tokens "
            f"({why}); carrying on elsewhere")

    def _stream(self, replica: Replica) -> Iterator[dict[str, Any]]:
        body = json.dumps(self.continuation()).encode()
        from_here = 0  # tokens this replica has given (SGLang's cumulative output_ids start at its own first)
        up = wire.send(replica.host, replica.port, "POST", self.door.path, body,
                       {"Content-Type": "application/json", "Accept": "text/event-stream"}, self.limits.connect_s)
        try:
            self._wait(up, replica, up.read_head)
            if up.status in (403, 404):
                raise NoTokenApi(up.status, self._wait(up, replica, up.read_body))
            if up.status != 200:
                raise UpstreamError(up.status, self._wait(up, replica, up.read_body))
            while True:
                data = self._wait(up, replica, up.next_event)
                if data is None or data == "[DONE]":
                    if self.finished is None:
                        raise wire.Lost("the stream ended before a finish")
                    if not self.door.usage_from_engine:
                        yield self._usage()
                    return
                chunk = json.loads(data)
                if "error" in chunk:
                    error = chunk["error"] if isinstance(chunk["error"], dict) else {}
                    code = error.get("code")
                    code = code if isinstance(code, int) and 400 <= code < 600 else 500
                    if code >= 500 and not self.pool.passes_check(replica):
                        raise wire.Lost(f"an error event and a failed health check: {str(error.get('message'))[:200]}")
                    raise UpstreamError(code, data.encode())
                chunk = self.door.chunk(chunk, from_here)
                from_here += len(chunk["choices"][0]["token_ids"]) if chunk.get("choices") else 0
                yield from self._take(chunk, replica)
        finally:
            up.close()

    def _take(self, chunk: dict[str, Any], replica: Replica) -> Iterator[dict[str, Any]]:
        choices = chunk.get("choices") or []
        if not choices:
            if chunk.get("usage") is not None:
                yield self._usage(chunk)
            return
        tokens = choices[0].get("token_ids") or []
        if self.resumes and self.resumes[-1].gap_s is None and (tokens or choices[0].get("finish_reason")):
            self.resumes[-1].gap_s = round(time.monotonic() - self.lost_at, 3)
            log(f"request {self.request.get('request_id', '?')}: carried on by {replica.url} "
                f"{self.resumes[-1].gap_s:.2f} s after the loss")
        self.output += tokens
        if choices[0].get("finish_reason") is not None:
            self.finished = choices[0]["finish_reason"]
        chunk = dict(chunk)
        chunk.pop("prompt_token_ids", None)  # the twin's prompt holds the first part of the output
        yield chunk

    def _usage(self, chunk: dict[str, Any] | None = None) -> dict[str, Any]:
        """The usage of the whole generation: the original prompt, every generated token."""
        prompt, made = len(self.prompt), len(self.output)
        out = dict(chunk or {"request_id": self.request.get("request_id", ""), "choices": []})
        out["usage"] = {"prompt_tokens": prompt, "completion_tokens": made, "total_tokens": prompt + made}
        return out

    def _wait(self, up: wire.Upstream, replica: Replica, read: Callable[[float], Any]) -> Any:
        return read_while_alive(self.pool, replica, up, read, self.limits, self.on_wait)


def read_while_alive(pool: Pool, replica: Replica, up: wire.Upstream, read: Callable[[float], Any], limits: Limits,
                     on_wait: Callable[[float], None] = lambda _quiet_s: None) -> Any:
    """read(tick_s) until it answers, telling on_wait of each quiet tick; silence past silence_s while the replica's
    health check fails is a loss (wire.Lost)."""
    while True:
        try:
            return read(limits.tick_s)
        except wire.Quiet:
            quiet = time.monotonic() - up.last_byte_at
            if quiet >= limits.silence_s and pool.is_down(replica):
                raise wire.Lost(f"silent for {quiet:.1f} s while its health check fails") from None
            on_wait(quiet)
