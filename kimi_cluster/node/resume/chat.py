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
- A request that is not streamed goes to a replica's own chat endpoint as it is; lost before its answer (a reset, or
  silence while the replica's health check fails), it is sent whole to another one. Nothing was answered yet, so
  nothing is answered twice.
"""

from __future__ import annotations

import json
import queue
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from . import messages, wire
from .generation import Generation, Limits, NoTokenApi, Unavailable, UpstreamError, read_while_alive
from .pool import Pool, Replica, log
from .render import RenderServers

CHAT_PATH = "/v1/chat/completions"
MESSAGES_PATH = "/v1/messages"
RENDER_PATH = "/v1/chat/completions/render"
MESSAGES_RENDER_PATH = "/v1/messages/render"
DERENDER_PATH = "/v1/chat/completions/derender"
GUIDED_FIELDS = ("structured_outputs", "guided_json", "guided_regex", "guided_choice", "guided_grammar",
                 "structural_tag")


class Client(Protocol):
    """What answers the client (server.py): a whole answer, or a stream of events and comments."""

    def whole(self, status: int, body: bytes, content_type: str = "application/json") -> None: ...
    def start_stream(self) -> None: ...
    def write(self, data: bytes) -> None: ...
    def end(self) -> None: ...


@dataclass(frozen=True)
class Front:
    pool: Pool
    render: RenderServers  # on the front's loopback
    limits: Limits = Limits()
    render_timeout_s: float = 60.0


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
    if (body.get("stream_options") or {}).get("continuous_usage_stats"):
        return "continuous usage stats"
    return None


def not_resumable_rendered(request: dict[str, Any]) -> str | None:
    """What the render server's GenerateRequest shows that the body did not: the engine constraining the output
    (a strict tool, Kimi K3's structural tags) is guided decoding too."""
    params = request.get("sampling_params") or {}
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
    usage chunk only if the client asked for it; an SSE comment while it waits, which clients skip."""

    keep_alive = b": waiting for the model\n\n"

    def __init__(self, body: dict[str, Any], _rendered: dict[str, Any]) -> None:
        self.body = body
        self.want_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        self.ident, self.created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())

    def chat_request(self) -> dict[str, Any]:
        return self.body

    def frames(self, chunk: dict[str, Any]) -> list[bytes]:
        if not chunk.get("choices") and not self.want_usage:
            return []
        return [b"data: " + json.dumps(dict(chunk, id=self.ident, created=self.created)).encode() + b"\n\n"]

    def done(self) -> bytes:
        return b"data: [DONE]\n\n"

    def error(self, code: int, message: str) -> bytes:
        return b"data: " + _error(code, message) + b"\n\n"


class MessagesFraming:
    """Anthropic's Messages stream (messages.py): events from the chat chunks, a ping while it waits."""

    keep_alive = messages.PING

    def __init__(self, _body: dict[str, Any], rendered: dict[str, Any]) -> None:
        self.rendered = rendered
        self.events = messages.MessageEvents(rendered.get("model"))

    def chat_request(self) -> dict[str, Any]:
        return messages.chat_request(self.rendered)

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
    route = ROUTES[path]
    try:
        body = json.loads(raw or b"{}")
    except ValueError:
        body = None
    if not isinstance(body, dict):
        return client.whole(400, _error(400, "request body must be a JSON object"))
    if not body.get("stream"):
        return whole(front, path, raw, client)
    reason = route.refuses(body)
    if reason is None:
        # No render server answering (one died; both are away) still serves the stream, unresumed.
        status, rendered, answer = front.render.call(route.render_path, body, front.render_timeout_s)
        if 400 <= status < 500 and status != 429:
            return client.whole(status, answer)  # the request's own fault, as the replica would have said it
        if status != 200 or not isinstance(rendered, dict):
            reason = f"the render server answers {status}: {answer[:200].decode('utf-8', 'replace')}"
        else:
            reason = not_resumable_rendered(rendered)
        if reason is None:
            try:
                return resumed(front, route.framing(body, rendered), rendered, client)
            except NoTokenApi as exc:  # raised only before the stream's first byte
                reason = f"a replica answers {exc.status} to the token API (started without --enable-scale-out?)"
    log(f"a stream not resumed: {reason}")
    return passed_through(front, path, raw, client)


def resumed(front: Front, framing: ChatFraming | MessagesFraming, rendered: dict[str, Any], client: Client) -> None:
    """Generate across replicas and derender, carrying the stream state. vLLM's streaming derender is stateless: it
    replays every earlier chunk through the parsers on each call (vllm/renderers/online_derenderer.py), so a call
    costs more the longer the stream. The generation runs on a thread of its own; once a call takes MERGE_AFTER_S or
    more, the next one takes every chunk that arrived meanwhile, merged into one (`merged`), so the stream keeps up
    with the replica whatever a call costs (vLLM's parsers take multi-token chunks, as under speculative decoding),
    and a cheap stream still goes out a chunk per token."""
    rendered = dict(rendered, stream=True, stream_options={"include_usage": True})
    prompt_ids = list(rendered["token_ids"])
    chat_request = framing.chat_request()
    arrived: queue.Queue[Any] = queue.Queue()
    gone = threading.Event()  # the client went away: the generation stops, and its replica aborts the request

    def waiting(_quiet_s: float) -> None:
        if gone.is_set():
            raise GoneAway()
        arrived.put(KEEP_ALIVE)

    generation = Generation(front.pool, rendered, front.limits, waiting)

    def produce() -> None:
        try:
            for chunk in generation.chunks():
                if gone.is_set():
                    return  # leaving the loop closes the generation and with it the replica's connection
                arrived.put(chunk)
            arrived.put(END)
        except GoneAway:
            return
        except Exception as exc:  # noqa: BLE001  # handed to the consumer, which answers the client with it
            arrived.put(exc)

    threading.Thread(target=produce, name="generation", daemon=True).start()
    started = False
    state: Any = None
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
            answer = _derender(front, {
                "stream": True, "model": rendered.get("model"), "generate_chunk": item, "stream_state": state,
                "prompt_tokens": len(prompt_ids), "prompt_token_ids": prompt_ids, "chat_request": chat_request,
            }, keep_alive if started else _nothing)
            slow[0] = time.monotonic() - called >= MERGE_AFTER_S
            state = answer["stream_state"]
            frames = framing.frames(answer["chunk"])
            if frames and not started:
                client.start_stream()
                started = True
            for frame in frames:
                client.write(frame)
    except UpstreamError as exc:
        if isinstance(exc, NoTokenApi) and not started:
            raise
        if not started:
            return client.whole(exc.status, exc.body)
        return _end_with(client, framing.error(exc.status, exc.body.decode("utf-8", "replace")))
    except (Unavailable, wire.Lost) as exc:
        if not started:
            return client.whole(503, _error(503, str(exc)))
        return _end_with(client, framing.error(503, str(exc)))
    finally:
        gone.set()
    if not started:
        client.start_stream()
    client.write(framing.done())
    client.end()


KEEP_ALIVE, END = object(), object()
# A derender call this long or longer (vLLM's replay of a stream some hundreds of tokens long: 4 ms at 100 tokens,
# 29 ms at 1,000, 126 ms at 4,000, measured on a 2-core machine, docs/operations.md) makes the next call take every
# chunk waiting.
MERGE_AFTER_S = 0.02


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
                                                stop_reason=choice.get("stop_reason"))])
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


def _send_to_replica(front: Front, path: str, raw: bytes, tried: tuple[Replica, ...], stream: bool,
                     ) -> tuple[Replica, wire.Upstream]:
    """Send the body as it is to a healthy replica's chat endpoint and read its status line and headers; a replica
    that cannot take it (refused, reset, a 5xx, silent while down) is marked down and the next one tried."""
    while True:
        replica = front.pool.pick(wait_s=front.limits.pick_s)
        if replica is None:
            raise Unavailable("no replica is healthy" + (f" (tried {', '.join(r.url for r in tried)})"
                                                         if tried else ""))
        tried = (*tried, replica)
        try:
            up = wire.send(replica.host, replica.port, "POST", path, raw,
                           {"Content-Type": "application/json",
                            "Accept": "text/event-stream" if stream else "application/json"}, front.limits.connect_s)
            _read(front, replica, up, up.read_head)
            if up.status >= 500:
                up.close()
                raise wire.Lost(f"HTTP {up.status}")
            return replica, up
        except wire.Lost as exc:
            front.pool.release(replica)
            front.pool.mark_lost(replica, str(exc))
            if len(tried) > front.limits.resumes:
                raise Unavailable(f"lost {len(tried)} replicas: {exc}") from None


def whole(front: Front, path: str, raw: bytes, client: Client) -> None:
    """A request that is not streamed: the first replica's whole answer, or the next one's if that one is lost."""
    tried: tuple[Replica, ...] = ()
    while True:
        try:
            if len(tried) > front.limits.resumes:
                raise Unavailable(f"lost {len(tried)} replicas during this request")
            replica, up = _send_to_replica(front, path, raw, tried, stream=False)
        except Unavailable as exc:
            return client.whole(503, _error(503, str(exc)))
        tried = (*tried, replica)
        try:
            answer = _read(front, replica, up, up.read_body)
            return client.whole(up.status, answer, up.headers.get("content-type", "application/json"))
        except wire.Lost as exc:
            front.pool.mark_lost(replica, str(exc))
            log(f"a request that is not streamed lost {replica.url} ({exc}); sending it whole to another replica")
        finally:
            up.close()
            front.pool.release(replica)


def passed_through(front: Front, path: str, raw: bytes, client: Client) -> None:
    """A stream that is not resumed: relayed as the replica sends it."""
    try:
        replica, up = _send_to_replica(front, path, raw, (), stream=True)
    except Unavailable as exc:
        return client.whole(503, _error(503, str(exc)))
    try:
        if up.status != 200:
            return client.whole(up.status, _read(front, replica, up, up.read_body),
                                up.headers.get("content-type", "application/json"))
        client.start_stream()
        while True:
            data = _read(front, replica, up, up.take_body)
            if not data:
                break
            client.write(data)
        client.end()
    except wire.Lost as exc:
        front.pool.mark_lost(replica, str(exc))
        message = f"the replica serving this stream was lost ({exc}); this request cannot be resumed exactly"
        _end_with(client, messages.error_event(message, "overloaded_error") if path == MESSAGES_PATH
                  else b"data: " + _error(503, message) + b"\n\n")
    finally:
        up.close()
        front.pool.release(replica)


def _read(front: Front, replica: Replica, up: wire.Upstream, read: Callable[[float], Any]) -> Any:
    return read_while_alive(front.pool, replica, up, read, front.limits)


def _error(code: int, message: str) -> bytes:
    """vLLM's error body (vllm/entrypoints/serve/engine/protocol.py ErrorResponse)."""
    kind = {400: "BadRequestError", 503: "ServiceUnavailableError"}.get(code, "InternalServerError")
    return json.dumps({"error": {"message": message, "type": kind, "param": None, "code": code}}).encode()


def _end_with(client: Client, frame: bytes) -> None:
    """An error event, as the engine streams one, then the end: the client's SDK raises it with its message."""
    try:
        client.write(frame)
        client.end()
    except OSError:
        pass
