"""One client request to `/v1/chat/completions` or `/v1/messages`, from its body to its answer.

- A resumable stream: rendered to tokens by vLLM's render server, generated across replicas (generation.py), each
  chunk derendered by the same server with its stream state carried here, so the parsers see one unbroken stream.
  The chunks keep one id and one `created` from the first to the last; while the stream waits (a loss, a pause) the
  client gets an SSE comment every tick, which OpenAI clients skip (a `ping` event for Anthropic's, messages.py).
- A stream that cannot be resumed exactly (guided decoding, `n` > 1, stop strings: `not_resumable` says why) goes
  to a replica's own chat endpoint as it is, and is retried elsewhere only before its first byte; cut later, it ends
  with an error event naming the cause.
- A replica that does not serve the token API (`vllm serve` without --enable-scale-out: one not yet restarted by
  the upgrade that turned this on) gets the request at its own chat endpoint, unresumed.
- An image change starts the new render server beside the old one and removes the old one once the new one
  answers (render.py): the calls go on to the new one with no gap. While no render server answers (a crash), a new
  stream passes through unresumed, and a stream already going waits for one, with its keep-alives, up to
  `render_timeout_s`: each derender call carries the whole stream so far, so any server picks it up.
- On SGLang replicas (`Front.engine` "sglang") the render server is SGLang's own chat route on the front, which
  keeps each stream's parsers and says which cuts can carry on exactly (sglang.py); the generation goes through
  SGLang's `/generate`.
- A request that is not streamed goes to a replica's own chat endpoint as it is (relay.py).
- The body is checked first (request.py): a bad one gets a 4xx naming the field. What reaches a render server or an
  engine carries the front's own request id and no client-chosen multimodal cache key.
- A client that stops reading holds its stream back, not this layer's memory: at most QUEUED chunks wait between
  the generation and the client's socket, the generation's thread then waits too (so its replica's connection
  fills and waits), and the server's write timeout ends the request (server.py), which aborts it on the replica.
"""

from __future__ import annotations

import contextlib
import json
import queue
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from . import messages, relay, request, sglang, wire
from .generation import Generation, Limits, NoTokenApi, Unavailable, UpstreamError
from .pool import Pool, log
from .relay import Client
from .render import RenderServers

CHAT_PATH = "/v1/chat/completions"
MESSAGES_PATH = "/v1/messages"
RENDER_PATH = "/v1/chat/completions/render"
MESSAGES_RENDER_PATH = "/v1/messages/render"
DERENDER_PATH = "/v1/chat/completions/derender"
GUIDED_FIELDS = ("structured_outputs", "guided_json", "guided_regex", "guided_choice", "guided_grammar",
                 "structural_tag")


@dataclass(frozen=True)
class Front:
    pool: Pool
    render: RenderServers  # on the front's loopback
    limits: Limits = Limits()
    render_timeout_s: float = 60.0
    engine: str = "vllm"  # or "sglang": `render` is then SGLang's chat layer on the front (sglang.py)


def not_resumable(body: dict[str, Any]) -> str | None:
    """Why a streamed chat request cannot be resumed exactly, or None. Guided decoding would restart its grammar on
    the twin; more than one choice shares no single prefix; vLLM's streaming derender cannot hold back text a stop
    string might cut (vLLM 0.33.0, vllm/entrypoints/scale_out/derender/serving.py)."""
    if (body.get("n") or 1) != 1:
        return "n > 1"
    fmt = body.get("response_format")
    if isinstance(fmt, dict) and fmt.get("type") not in (None, "text"):
        return "guided decoding (response_format)"
    for name in GUIDED_FIELDS:
        if body.get(name) is not None:
            return f"guided decoding ({name})"
    choice = body.get("tool_choice")
    if choice == "required" or isinstance(choice, dict):
        return "a forced tool_choice (guided decoding)"
    if body.get("stop"):
        return "stop strings"
    if request.wants(body.get("stream_options"), "continuous_usage_stats"):
        return "continuous usage stats"
    return None


def not_resumable_rendered(rendered: dict[str, Any]) -> str | None:
    """What the render server's GenerateRequest shows that the body did not: the engine constraining the output
    (a strict tool, Kimi K3's structural tags) is guided decoding too."""
    params = rendered.get("sampling_params") or {}
    if params.get("structured_outputs"):
        return "guided decoding (the engine constrains this request's output)"
    if (params.get("n") or 1) != 1:
        return "n > 1"
    if params.get("stop"):
        return "stop strings"
    if params.get("max_tokens") is None:
        return "no max_tokens"
    return None


def not_resumable_messages(body: dict[str, Any]) -> str | None:
    """not_resumable for an Anthropic Messages body: a forced tool (`any`, `tool`) is guided decoding, stop
    sequences are stop strings."""
    choice = body.get("tool_choice")
    if isinstance(choice, dict) and choice.get("type") in ("any", "tool"):
        return "a forced tool_choice (guided decoding)"
    if body.get("stop_sequences"):
        return "stop sequences"
    return None


class ChatFraming:
    """OpenAI's chat completion stream: `data:` chunks (one id and one `created` throughout), `[DONE]` last; the
    usage chunk only if the client asked for it; an SSE comment while it waits, which clients skip.

    The derender reads the chat request for its parsers and its decoding, not for the conversation: it gets the
    render's parse context (as a Messages stream does: messages.chat_request) and the few decoding switches of the
    body that vLLM's streaming derender reads besides (vllm/renderers/online_derenderer.py), never the body itself,
    so a client's large field is not carried to the render server on every call."""

    keep_alive = b": waiting for the model\n\n"
    # Read by the derender from the chat request: whether to return token ids and logprobs and how many, and the
    # special-token decoding. Small values: the render server validated them with the rest of the body.
    DECODING = ("return_token_ids", "logprobs", "top_logprobs", "skip_special_tokens",
                "spaces_between_special_tokens", "include_stop_str_in_output", "ignore_eos")

    def __init__(self, body: dict[str, Any], rendered: dict[str, Any]) -> None:
        self.want_usage = request.wants(body.get("stream_options"), "include_usage")
        self.ident, self.created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        self.request = messages.chat_request(rendered)
        self.request.update({name: body[name] for name in self.DECODING if body.get(name) is not None})
        if body.get("logprob_token_ids"):  # only whether it is set is read (_chat_top_logprobs_limit)
            self.request["logprob_token_ids"] = list(body["logprob_token_ids"][:1])
        # Read only to drop the token that stopped the generation: sent with the chunk that finishes on "stop".
        self.stop_token_ids = (rendered.get("sampling_params") or {}).get("stop_token_ids") or []

    def chat_request(self, finishing: bool = False) -> dict[str, Any]:
        if finishing and self.stop_token_ids:
            return dict(self.request, stop_token_ids=self.stop_token_ids)
        return self.request

    def frames(self, chunk: dict[str, Any]) -> list[bytes]:
        if not chunk.get("choices") and not self.want_usage:
            return []
        return [b"data: " + json.dumps(dict(chunk, id=self.ident, created=self.created)).encode() + b"\n\n"]

    def done(self) -> bytes:
        return b"data: [DONE]\n\n"

    def error(self, code: int, message: str) -> bytes:
        """vLLM's error event, then `[DONE]`, as vLLM ends a stream that failed."""
        return b"data: " + request.error_body(code, message) + b"\n\n" + self.done()


class MessagesFraming:
    """Anthropic's Messages stream (messages.py): events from the chat chunks, a ping while it waits."""

    keep_alive = messages.PING

    def __init__(self, _body: dict[str, Any], rendered: dict[str, Any]) -> None:
        self.chat = messages.chat_request(rendered)
        self.events = messages.MessageEvents(rendered.get("model"))

    def chat_request(self, finishing: bool = False) -> dict[str, Any]:
        return self.chat

    def frames(self, chunk: dict[str, Any]) -> list[bytes]:
        return self.events.feed(chunk)

    def done(self) -> bytes:
        return b""

    def error(self, code: int, message: str) -> bytes:
        return messages.error_event(message, "overloaded_error" if code == 503 else "api_error")


@dataclass(frozen=True)
class Route:
    path: str
    render_path: str
    framing: type[ChatFraming] | type[MessagesFraming]
    refuses: Callable[[dict[str, Any]], str | None]


ROUTES = {route.path: route for route in (
    Route(CHAT_PATH, RENDER_PATH, ChatFraming, not_resumable),
    Route(MESSAGES_PATH, MESSAGES_RENDER_PATH, MessagesFraming, not_resumable_messages),
)}


def handle(front: Front, path: str, raw: bytes, client: Client) -> None:
    """Answer one request (request.BadRequest, raised before anything is sent on, is the server's to answer)."""
    route = ROUTES[path]
    with PARSING if len(raw) > LARGE_BODY else contextlib.nullcontext():
        body = request.parse(raw)
        stream = request.streamed(body, with_options=path == CHAT_PATH)
        # Every id an engine sees is the front's: vLLM's Messages request has no request_id field to set.
        own_id = request.front_request_id()
        body, _taken = request.engine_body(body, own_id if path == CHAT_PATH else None)
        forward = request.encoded(body)  # what is sent on, in place of the client's bytes
    if not stream:
        del body  # held no longer than it is needed: a body of tiny objects takes many times its size parsed
        return relay.whole(front.pool, front.limits, path, forward, client)
    on_sglang = front.engine == "sglang"
    reason = sglang.not_resumable(body, path) if on_sglang else route.refuses(body)
    if reason is None:
        # No render server answering (one died; both are away) still serves the stream, unresumed.
        render_path = sglang.RENDER_PATH if on_sglang else route.render_path
        status, rendered, answer = front.render.call(render_path, forward, front.render_timeout_s)
        if 400 <= status < 500 and status != 429:
            return client.whole(status, answer)  # the request's own fault, as the replica would have said it
        if status != 200 or not isinstance(rendered, dict):
            reason = f"the render server answers {status}: {answer[:200].decode('utf-8', 'replace')}"
        else:
            reason = rendered.get("not_resumable") if on_sglang else not_resumable_rendered(rendered)
        if reason is None:
            rendered["request_id"] = own_id
            layer = sglang.SglangDerender(front.render, rendered, front.render_timeout_s) if on_sglang else None
            framing = route.framing(body, {"model": body.get("model")} if on_sglang else rendered)
            del body
            try:
                return resumed(front, framing, rendered, client, layer)
            except NoTokenApi as exc:  # raised only before the stream's first byte
                reason = f"a replica answers {exc.status} to the token API (started without --enable-scale-out?)"
    log(f"a stream not resumed: {reason}")
    return relay.passed_through(front.pool, front.limits, path, forward, client)


# Bodies larger than this are parsed two at a time: parsing one of many tiny objects takes some ten times its size
# for a moment (docs/operations.md has the figures), and the front's memory is shared with the render server.
LARGE_BODY = 1 << 20
PARSING = threading.BoundedSemaphore(2)


def resumed(front: Front, framing: ChatFraming | MessagesFraming, rendered: dict[str, Any], client: Client,
            layer: Derender | None = None) -> None:
    """Generate across replicas and derender, carrying the stream state. vLLM's streaming derender is stateless: it
    replays every earlier chunk through the parsers on each call (vllm/renderers/online_derenderer.py), so a call
    costs more the longer the stream. The generation runs on a thread of its own; once a call takes MERGE_AFTER_S or
    more, the next one takes every chunk that arrived meanwhile, merged into one (`merged`), so the stream keeps up
    with the replica whatever a call costs (vLLM's parsers take multi-token chunks, as under speculative decoding),
    and a cheap stream still goes out a chunk per token. A stream that costly also leaves the render server to the
    others between its calls (DERENDER_SHARE)."""
    layer = layer or VllmDerender(front, framing, rendered)
    arrived: queue.Queue[Any] = queue.Queue(maxsize=QUEUED)
    gone = threading.Event()  # the client went away: the generation stops, and its replica aborts the request

    def put(item: Any) -> None:
        """Hand the consumer an item, waiting while QUEUED wait already (the replica waits meanwhile)."""
        while True:
            if gone.is_set():
                raise GoneAway()
            try:
                return arrived.put(item, timeout=front.limits.tick_s)
            except queue.Full:
                continue

    def waiting(_quiet_s: float) -> None:
        put(KEEP_ALIVE)

    generation = layer.generation(front, waiting)

    def produce() -> None:
        chunks = generation.chunks()  # a generator: close() ends it where it waits
        try:
            for chunk in chunks:
                put(chunk)
            put(END)
        except GoneAway:
            return
        except Exception as exc:  # noqa: BLE001  # handed to the consumer, which answers the client with it
            try:
                put(exc)
            except GoneAway:
                return
        finally:
            chunks.close()  # the replica's connection closes with it: vLLM aborts a request whose client went

    threading.Thread(target=produce, name="generation", daemon=True).start()
    started = False
    slow = [False]  # the last derender call took MERGE_AFTER_S or more

    def keep_alive() -> None:
        client.write(framing.keep_alive)

    try:
        for item in _merged(arrived, lambda: slow[0]):
            if item is KEEP_ALIVE:
                if started:
                    keep_alive()
                continue
            called = time.monotonic()
            chunks = layer.derender(item, keep_alive if started else _nothing)
            took = time.monotonic() - called
            slow[0] = took >= MERGE_AFTER_S
            frames = [frame for chunk in chunks for frame in framing.frames(chunk)]
            if frames and not started:
                client.start_stream()
                started = True
            for frame in frames:
                client.write(frame)
            if slow[0]:
                time.sleep(_yield_after(took, front.limits.tick_s))
    except UpstreamError as exc:
        if isinstance(exc, NoTokenApi) and not started:
            raise
        if not started:
            return client.whole(exc.status, exc.body)
        return relay.end_with(client, framing.error(exc.status, _message(exc.body)))
    except (Unavailable, wire.Lost) as exc:
        if not started:
            return client.whole(503, request.error_body(503, str(exc)))
        return relay.end_with(client, framing.error(503, str(exc)))
    finally:
        gone.set()
    if not started:
        client.start_stream()
    client.write(framing.done())
    client.end()


class Derender(Protocol):
    """The chat layer a resumed stream is turned back into chat chunks by: the generation it makes, and the chat
    chunks of each of its token chunks (waiting() told every tick while no chat layer answers)."""

    def generation(self, front: Front, waiting: Callable[[float], None]) -> Generation: ...
    def derender(self, item: dict[str, Any], waiting: Callable[[], None]) -> list[dict[str, Any]]: ...


class VllmDerender:
    """vLLM's render server: each call carries the stream state (vLLM's streaming derender is stateless)."""

    def __init__(self, front: Front, framing: ChatFraming | MessagesFraming, rendered: dict[str, Any]) -> None:
        self.front, self.framing, self.state = front, framing, None
        self.rendered = dict(rendered, stream=True, stream_options={"include_usage": True})
        self.prompt_ids = list(rendered["token_ids"])

    def generation(self, front: Front, waiting: Callable[[float], None]) -> Generation:
        return Generation(front.pool, self.rendered, front.limits, waiting)

    def derender(self, item: dict[str, Any], waiting: Callable[[], None]) -> list[dict[str, Any]]:
        finishing = any(choice.get("finish_reason") == "stop" for choice in item.get("choices") or ())
        answer = _derender(self.front, {
            "stream": True, "model": self.rendered.get("model"), "generate_chunk": item, "stream_state": self.state,
            "prompt_tokens": len(self.prompt_ids), "prompt_token_ids": self.prompt_ids,
            "chat_request": self.framing.chat_request(finishing)}, waiting)
        self.state = answer["stream_state"]
        return [answer["chunk"]]


KEEP_ALIVE, END = object(), object()
# Chunks waiting between the generation and a client that reads slower than the replica writes (each a few hundred
# bytes): past this the generation waits, and with it the replica's connection.
QUEUED = 64
# A derender call this long or longer (vLLM's replay of a stream some hundreds of tokens long: 4 ms at 100 tokens,
# 29 ms at 1,000, 126 ms at 4,000, measured on a 2-core machine, docs/operations.md) makes the next call take every
# chunk waiting.
MERGE_AFTER_S = 0.02
# The share of the render server one stream's derender calls may take once they are that costly: after a call of d
# seconds the stream leaves the server d * (1 / share - 1) seconds to others (its chunks meanwhile merged into the
# next call), so a long stream, or one a client stopped reading while the front's buffers still take it, cannot hold
# the one render server every new stream renders on (bench_replicas --noisy, docs/operations.md: at 0.25 the
# first chunk's median still rose 1.02-1.13x beside such a stream).
DERENDER_SHARE = 0.15


def _yield_after(took_s: float, most_s: float) -> float:
    """How long a stream whose last derender call took took_s leaves the render server to others (at most most_s,
    its keep-alive tick, so the stream never waits longer than a keep-alive would)."""
    return min(most_s, took_s * (1 / DERENDER_SHARE - 1))


def _nothing() -> None:
    pass


def _derender(front: Front, payload: dict[str, Any], waiting: Callable[[], None]) -> dict[str, Any]:
    """One derender call. No render server may answer for a while (a crash restarts its container): every call
    carries the whole stream so far, so the call is made again, with a keep-alive each tick, until one answers or
    front.render_timeout_s has passed since the first failure."""
    deadline = time.monotonic() + front.render_timeout_s
    while True:
        status, answer, raw = front.render.call(DERENDER_PATH, payload, front.render_timeout_s)
        if status == 200 and isinstance(answer, dict):
            return answer
        if status < 500 or time.monotonic() >= deadline:
            raise UpstreamError(status if status >= 400 else 502, raw)
        log(f"derender: the render server answers {status}; again in {front.limits.tick_s:g} s")
        waiting()
        time.sleep(front.limits.tick_s)


class GoneAway(Exception):
    """The client of a stream went away."""


def _merged(arrived: queue.Queue[Any], behind: Callable[[], bool]) -> Iterator[Any]:
    """The generation's chunks as they arrived; while `behind()`, each run of token chunks already waiting merged
    into one (their tokens in order, the last one's finish). A usage chunk, a keep-alive and the end stand alone. An
    exception the generation raised is raised here, after the chunks before it."""
    held: dict[str, Any] | None = None
    while True:
        item = arrived.get() if held is None else (_next_waiting(arrived) if behind() else None)
        if item is None:  # nothing more waiting: the merged run goes out
            yield held
            held = None
            continue
        if isinstance(item, dict) and item.get("choices"):
            if held is None:
                held = item
            else:
                first, choice = held["choices"][0], item["choices"][0]
                held = dict(held, choices=[dict(first, token_ids=(first.get("token_ids") or [])
                                                + (choice.get("token_ids") or []),
                                                finish_reason=choice.get("finish_reason"),
                                                stop_reason=choice.get("stop_reason"),
                                                **{k: choice[k] for k in ("sglang_finish",) if k in choice})])
            continue
        if held is not None:
            yield held
            held = None
        if item is END:
            return
        if isinstance(item, Exception):
            raise item
        yield item


def _next_waiting(arrived: queue.Queue[Any]) -> Any:
    try:
        return arrived.get_nowait()
    except queue.Empty:
        return None


def _message(body: bytes) -> str:
    """The message of an engine's error body (or event), or the body itself."""
    try:
        error = json.loads(body).get("error")
        return str(error.get("message")) if isinstance(error, dict) else body.decode("utf-8", "replace")
    except (ValueError, AttributeError):
        return body.decode("utf-8", "replace")[:500]
