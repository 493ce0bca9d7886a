"""The two tools the tool_calls check offers the model: their OpenAI schemas and local implementations."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from kimi_cluster.checks.arithmetic import safe_arithmetic

if TYPE_CHECKING:  # the SDK is the verification's extra (requirements-verify.txt); mypy checks the schemas against it
    from openai.types.chat import ChatCompletionToolParam


def tool_calculate(expression: str) -> dict[str, Any]:
    return {"result": safe_arithmetic(expression)}


WEATHER = {"Tokyo": "22C, clear", "London": "14C, rain", "Cairo": "35C, sunny"}


def tool_get_weather(city: str) -> dict[str, Any]:
    return {"city": city, "weather": WEATHER.get(city, "18C, partly cloudy")}


TOOL_IMPLS: dict[str, Callable[..., dict[str, Any]]] = {
    "calculate": tool_calculate,
    "get_weather": tool_get_weather,
}

# Plain JSON on the wire (the requests-based checks send it as it is), typed as the OpenAI SDK's own tool shape.
TOOLS: list[ChatCompletionToolParam] = [
    {
        "type": "function",
        "function": {
            "name": "calculate",
            "description": "Evaluate a basic arithmetic expression.",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string", "description": "e.g. '47*89'"}},
                "required": ["expression"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get current weather for a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    },
]
