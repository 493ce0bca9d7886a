"""What a client's body may be before this layer acts on it, and what of it an engine gets.

Every client is treated as hostile: Caddy checked its key, nothing else. A body is refused with a 4xx naming the
field, in vLLM's error shape, before anything is sent on:
- bounded before it is parsed: json.loads of many tiny objects takes some 25 times the body's size, so a body with
  more objects and arrays (`{` and `[`, counted in its bytes: an upper bound) or more values (`,`) than a real
  request holds is refused unread; one nested deeper than MAX_DEPTH too (Python's parser would end in a
  RecursionError);
- `stream` and `stream_options` are read as vLLM's pydantic model reads them (lax mode: `"false"` is false), and
  a value it refuses is refused here the same way.

And what it carries that would reach an engine under the client's control is the front's instead
(`engine_body`): the request id (vLLM takes a body's `request_id`, or an `X-Request-Id` header, which this layer
never forwards; vLLM's abort API ends requests by that id), and a multimodal item's `uuid` (vLLM uses it, not the
item's content, as the item's cache key: vllm/renderers/chat_utils/chat_message.py).
"""

from __future__ import annotations

import json
import uuid
from typing import Any

MAX_DEPTH = 64  # objects and arrays inside each other: tool schemas use a handful
MAX_CONTAINERS = 200_000  # `{` and `[` bytes in a body (a conversation of thousands of turns holds a few ten thousand)
MAX_VALUES = 1_000_000  # `,` bytes in a body: every value of an array or object after the first follows one
# pydantic's lax bool (vLLM's `stream: bool | None`): these strings, in any case, and the numbers 0 and 1.
TRUE_WORDS = frozenset({"1", "on", "t", "true", "y", "yes"})
FALSE_WORDS = frozenset({"0", "off", "f", "false", "n", "no"})
# Fields of a body that only render endpoints read, and that hand the engine what the client chose: `mm_payload`
# "none" makes the render leave out the processed images, which the engine then reads as cached.
RENDER_ONLY = ("mm_payload", "return_mm_kwargs")
KINDS = {400: "BadRequestError", 404: "NotFoundError", 408: "RequestTimeoutError", 413: "RequestTooLargeError",
         500: "InternalServerError", 503: "ServiceUnavailableError"}


class BadRequest(Exception):
    """The client's request cannot be served as sent: `status` and a message naming the field (`param`)."""

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param = status, message, param

    def body(self) -> bytes:
        return error_body(self.status, self.message, self.param)


def error_body(code: int, message: str, param: str | None = None) -> bytes:
    """vLLM's error body (vllm/entrypoints/serve/engine/protocol.py ErrorResponse)."""
    kind = KINDS.get(code, "InternalServerError")
    return json.dumps({"error": {"message": message, "type": kind, "param": param, "code": code}}).encode()


def parse(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object, within the bounds above (BadRequest otherwise)."""
    containers = raw.count(b"{") + raw.count(b"[")
    if containers > MAX_CONTAINERS:
        raise BadRequest(400, f"the request body holds more than {MAX_CONTAINERS} JSON objects and arrays")
    if raw.count(b",") > MAX_VALUES:
        raise BadRequest(400, f"the request body holds more than {MAX_VALUES} JSON values")
    try:
        body = json.loads(raw or b"{}")
    except RecursionError:
        raise BadRequest(400, f"the request body is nested more than {MAX_DEPTH} deep") from None
    except ValueError as exc:  # UnicodeDecodeError included
        raise BadRequest(400, f"the request body is not JSON: {str(exc)[:120]}") from None
    if not isinstance(body, dict):
        raise BadRequest(400, "the request body must be a JSON object")
    if _depth(body) > MAX_DEPTH:
        raise BadRequest(400, f"the request body is nested more than {MAX_DEPTH} deep")
    return body


def _depth(value: Any) -> int:
    """How deep objects and arrays nest in value (without recursion: the bound is what is checked)."""
    deepest, todo = 0, [(value, 1)]
    while todo:
        item, depth = todo.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        for child in children:
            if isinstance(child, (dict, list)):
                if depth + 1 > MAX_DEPTH:
                    return depth + 1
                deepest = max(deepest, depth + 1)
                todo.append((child, depth + 1))
    return max(deepest, 1)


def lax_bool(value: Any, field: str) -> bool | None:
    """A `bool | None` field as vLLM's pydantic model reads it (lax mode), or BadRequest naming the field."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, (int, float)) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.lower() in TRUE_WORDS | FALSE_WORDS:
        return value.lower() in TRUE_WORDS
    raise BadRequest(400, f"{field}: Input should be a valid boolean", field)


def streamed(body: dict[str, Any], with_options: bool = True) -> bool:
    """Whether the body asks for a stream, checking `stream` and (`with_options`: a chat body; vLLM's Messages model
    ignores the field) `stream_options` as vLLM would."""
    options = body.get("stream_options") if with_options else None
    if options is not None:
        if not isinstance(options, dict):
            raise BadRequest(400, "stream_options: Input should be an object", "stream_options")
        for name in ("include_usage", "continuous_usage_stats"):
            lax_bool(options.get(name), f"stream_options.{name}")
    return bool(lax_bool(body.get("stream"), "stream"))


def wants(options: Any, name: str) -> bool:
    """A stream option of a body `streamed` accepted."""
    return bool(lax_bool((options or {}).get(name), f"stream_options.{name}"))


def front_request_id() -> str:
    """A request id of the front's own: random, so no client can name (and abort) another's request."""
    return f"kimi-{uuid.uuid4().hex}"


def engine_body(body: dict[str, Any], request_id: str | None) -> tuple[dict[str, Any], list[str]]:
    """The body an engine or a render server is sent, and what was taken out of it: the client's `request_id`
    (replaced by `request_id`, or dropped when None), the render-only fields, and every content part's `uuid`."""
    out = {name: value for name, value in body.items() if name != "request_id" and name not in RENDER_ONLY}
    taken = [name for name in ("request_id", *RENDER_ONLY) if name in body]
    if request_id is not None:
        out["request_id"] = request_id
    messages = body.get("messages")
    if isinstance(messages, list):
        out["messages"] = [_without_uuids(message, taken) for message in messages]
    return out, taken


def encoded(body: dict[str, Any]) -> bytes:
    """The body as sent on: UTF-8 as a client would send it (escaping every non-ASCII character could make it up to
    six times larger); a lone surrogate, which JSON can escape but UTF-8 cannot hold, is sent escaped as it came."""
    try:
        return json.dumps(body, ensure_ascii=False).encode()
    except UnicodeEncodeError:
        return json.dumps(body).encode()


def _without_uuids(message: Any, taken: list[str]) -> Any:
    if not isinstance(message, dict) or not isinstance(message.get("content"), list):
        return message
    parts = []
    for part in message["content"]:
        if isinstance(part, dict) and "uuid" in part:
            part = {name: value for name, value in part.items() if name != "uuid"}
            if "uuid" not in taken:
                taken.append("uuid")
        parts.append(part)
    return dict(message, content=parts)
