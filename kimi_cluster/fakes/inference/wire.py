"""The wire shapes of a reply: OpenAI chat completions (whole or streamed), Anthropic messages and their
events, and the token counts."""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Iterator
from typing import Any

from .compose import text_of, words
from .settings import FakeSettings, Reply


def message_payload(reply: Reply, settings: FakeSettings) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": reply.content, "tool_calls": reply.tool_calls or None}
    if "no_reasoning" in settings.faults:
        message["content"] = f"<think>{reply.reasoning}</think>{reply.content or ''}"
    else:
        message[settings.reasoning_field] = reply.reasoning
    return message


def token_usage(messages: list[dict[str, Any]], reply: Reply) -> dict[str, int]:
    prompt = sum(words(text_of(m.get("content"))) for m in messages)
    completion = words(reply.reasoning) + words(reply.content or "")
    completion += sum(words(c["function"]["arguments"]) for c in reply.tool_calls)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def stream_chunks(reply: Reply, settings: FakeSettings, model: str, include_usage: bool,
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
    message = message_payload(reply, settings)
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


def anthropic_to_openai(body: dict[str, Any]) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    system = body.get("system")
    if system:
        messages.append({"role": "system", "content": text_of(system) if isinstance(system, list) else system})
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



def then_done(events: Iterator[bytes]) -> Iterator[bytes]:
    yield from events
    yield b"data: [DONE]\n\n"


def anthropic_events(message: dict[str, Any]) -> Iterator[bytes]:
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
