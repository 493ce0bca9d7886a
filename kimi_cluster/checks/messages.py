"""The shape of an assistant message as SGLang and vLLM send it, and the turn a client sends back."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# SGLang names the thinking `reasoning_content`, vLLM names it `reasoning`; both accept either
# name on the way back in, so a client has to look for both.
REASONING_FIELDS: tuple[str, ...] = ("reasoning_content", "reasoning")


def reasoning_of(message: Mapping[str, Any]) -> tuple[str | None, str]:
    """(field name, text) of the thinking in an assistant message, whichever engine sent it."""
    for name in REASONING_FIELDS:
        value = message.get(name)
        if isinstance(value, str) and value.strip():
            return name, value
    return None, ""


def assistant_turn(message: Mapping[str, Any]) -> dict[str, Any]:
    """The assistant message to send back: content, reasoning under the name it came in, tool calls.

    Kimi K3.1 Pro needs the whole turn back; rebuilding it from content alone loses the thinking.
    """
    turn: dict[str, Any] = {"role": "assistant", "content": message.get("content") or ""}
    for name in REASONING_FIELDS:
        if message.get(name):
            turn[name] = message[name]
    if message.get("tool_calls"):
        turn["tool_calls"] = message["tool_calls"]
    return turn
