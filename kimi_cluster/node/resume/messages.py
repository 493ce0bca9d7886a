"""Anthropic's `/v1/messages` stream, made from the chat chunks vLLM's derender gives.

vLLM serves `/v1/messages` by converting the request to a chat request and the chat stream back to Anthropic's
events (vLLM 0.33.0, vllm/entrypoints/anthropic/serving.py, `message_stream_converter`); its render server renders a
Messages request the same way (`/v1/messages/render`) but derenders only chat. So a resumable Messages stream is
rendered by `/v1/messages/render`, derendered as chat with the request's parse context (the tools, the tool choice
and the thinking switch the parsers read), and turned into events here with the rules of vLLM's converter: a
thinking block signed when it closes, text, one tool_use block per call with its arguments as input_json_delta,
then message_delta with the stop reason and the usage, and message_stop. Only the framing is written here; every
token is parsed by vLLM's own parsers.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

# vLLM's _to_anthropic_stop_reason for the finishes a resumable stream can have (no stop strings: not_resumable).
STOP_REASONS = {"length": "max_tokens", "tool_calls": "tool_use", "stop": "end_turn"}
PING = b'event: ping\ndata: {"type": "ping"}\n\n'


def event(name: str, data: dict[str, Any]) -> bytes:
    return f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()


def chat_request(rendered: dict[str, Any]) -> dict[str, Any]:
    """The chat request the derender parses with: the render's parse context (vLLM's ParseContext, whose
    `to_chat_request` builds the same message-less request), with as many earlier tool calls as the conversation
    holds, so that the parser numbers this turn's calls on from them as vLLM's coupled Messages path does."""
    context = dict(rendered.get("parse_context") or {})
    earlier = int(context.pop("history_tool_call_cnt", 0) or 0)
    messages: list[dict[str, Any]] = []
    if earlier:
        calls = [{"id": f"earlier-{i}", "type": "function", "function": {"name": "earlier", "arguments": "{}"}}
                 for i in range(earlier)]
        messages.append({"role": "assistant", "content": "", "tool_calls": calls})
    return {"model": rendered.get("model"), "messages": messages, "stream": True, **context}


class MessageEvents:
    """Feed it the derendered chat chunks in order; it returns the Anthropic events each one makes."""

    def __init__(self, model: str | None) -> None:
        self.model = model
        self.started = False
        self.index = 0  # the next content block's index
        self.block: str | None = None  # the open block's type
        self.tool_id: str | None = None
        self.ids: dict[int, str] = {}  # tool call index -> its tool_use id
        self.tool_used = False
        self.finish: str | None = None

    def feed(self, chunk: dict[str, Any]) -> list[bytes]:
        out: list[bytes] = []
        if not self.started:
            self.started = True
            usage = chunk.get("usage") or {}
            out.append(event("message_start", {"type": "message_start", "message": {
                "id": f"msg_{uuid.uuid4().hex}", "type": "message", "role": "assistant", "content": [],
                "model": self.model, "stop_reason": None, "stop_sequence": None,
                "usage": {"input_tokens": usage.get("prompt_tokens") or 0, "output_tokens": 0}}}))
        choices = chunk.get("choices") or []
        if not choices:
            if chunk.get("usage") is not None:
                out += self._close()
                usage = chunk["usage"]
                reason = "tool_use" if self.tool_used and self.finish in ("stop", "tool_calls") else \
                    STOP_REASONS.get(self.finish or "stop")
                out.append(event("message_delta", {
                    "type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": None},
                    "usage": {"input_tokens": usage.get("prompt_tokens") or 0,
                              "output_tokens": usage.get("completion_tokens") or 0}}))
                out.append(event("message_stop", {"type": "message_stop"}))
            return out
        choice = choices[0]
        if choice.get("finish_reason") is not None:
            self.finish = choice["finish_reason"]
        delta = choice.get("delta") or {}
        if delta.get("reasoning"):
            if self.block != "thinking":
                out += self._close() + self._open({"type": "thinking", "thinking": ""})
            out.append(self._delta({"type": "thinking_delta", "thinking": delta["reasoning"]}))
        if delta.get("content"):
            if self.block != "text":
                out += self._close() + self._open({"type": "text", "text": ""})
            out.append(self._delta({"type": "text_delta", "text": delta["content"]}))
        for call in delta.get("tool_calls") or []:
            function = call.get("function") or {}
            if call.get("id") is not None:
                self.ids[call["index"]] = call["id"]
                if self.tool_id != call["id"] and function.get("name") is not None:
                    out += self._close() + self._open({"type": "tool_use", "id": call["id"],
                                                       "name": function["name"], "input": {}})
                    self.tool_id, self.tool_used = call["id"], True
            if function.get("arguments") and self.tool_id == self.ids.get(call["index"]):
                out.append(self._delta({"type": "input_json_delta", "partial_json": function["arguments"]}))
        return out

    def _open(self, block: dict[str, Any]) -> list[bytes]:
        self.block = block["type"]
        return [event("content_block_start", {"type": "content_block_start", "index": self.index,
                                              "content_block": block})]

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return event("content_block_delta", {"type": "content_block_delta", "index": self.index, "delta": delta})

    def _close(self) -> list[bytes]:
        if self.block is None:
            return []
        out = []
        if self.block == "thinking":  # as vLLM's converter: the signature closes the thinking block
            out.append(self._delta({"type": "signature_delta", "signature": uuid.uuid4().hex}))
        out.append(event("content_block_stop", {"type": "content_block_stop", "index": self.index}))
        self.block, self.tool_id = None, None
        self.index += 1
        return out


def error_event(message: str, kind: str = "api_error") -> bytes:
    """Anthropic's error event, as vLLM's converter ends a failed stream."""
    return event("error", {"type": "error", "error": {"type": kind, "message": message}})
