"""The scripted assistant turn: answers that depend on the request (tool results, real pixels, earlier
reasoning), and the refusals of a bad request."""

from __future__ import annotations

import json
import re
import zlib
from base64 import b64decode
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

from .media import fetch_image
from .png import half_colours
from .settings import EFFORTS, FakeSettings, HttpError, Reply


def text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    return ""


def images_of(content: Any) -> list[str]:
    if not isinstance(content, list):
        return []
    urls = []
    for part in content:
        if isinstance(part, dict) and part.get("type") == "image_url":
            image = part.get("image_url")
            urls.append(image.get("url", "") if isinstance(image, dict) else str(image))
    return urls


def words(text: str) -> int:
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
    prompt = text_of(messages[user_index].get("content"))
    after_user = messages[user_index + 1 :]
    tool_results = [m for m in after_user if m.get("role") == "tool"]

    if tool_results:
        return _answer_from_tools(after_user, tool_results, prompt, effort, settings)

    images = images_of(messages[user_index].get("content"))
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
    if urlsplit(url).scheme.lower() in ("http", "https"):
        png = fetch_image(url)  # raises what vLLM answers to a URL it cannot fetch
    else:
        match = re.match(r"data:image/png;base64,(.+)$", url, re.S)
        if not match:
            raise HttpError(400, "only http(s) URLs and data:image/png;base64 URIs are understood by the fake server")
        png = b64decode(match.group(1), validate=False)
    try:
        left, right = half_colours(png)
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
