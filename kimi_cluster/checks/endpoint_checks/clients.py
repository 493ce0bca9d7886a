"""The clients check: the official OpenAI and Anthropic Python SDKs (pinned in requirements.txt), as other teams use
them, accept the endpoint's answers as they are: a chat, a tool-call round trip, a stream and an Anthropic message,
over TLS trusting the endpoint's CA.

The SDKs parse every answer into their own types, so a field they cannot read fails here even when raw JSON looks
fine. The Anthropic client sends the key as `Authorization: Bearer` (its `auth_token`, what Claude Code does for
ANTHROPIC_AUTH_TOKEN), the only header the engines and the proxy accept.
"""

from __future__ import annotations

import json
import ssl
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from kimi_cluster.checks.client import Api
from kimi_cluster.checks.messages import assistant_turn
from kimi_cluster.checks.prompts import (
    ANTHROPIC_PROMPT,
    LONG_BUDGET,
    MAX_TOOL_TURNS,
    SHORT_BUDGET,
    STREAM_PROMPT,
    TOOL_TASK,
    WHO_PROMPT,
)
from kimi_cluster.checks.results import CheckFailed
from kimi_cluster.checks.text import short
from kimi_cluster.checks.tools import TOOL_IMPLS, TOOLS

if TYPE_CHECKING:
    # The SDKs are imported where the check runs: together they take seconds of CPU to import, which every process
    # that only loads the checks (a Pulumi program registering the checks resource, a CLI printing its help) would
    # otherwise pay.
    import anthropic
    import openai


def _ssl_context(api: Api) -> ssl.SSLContext:
    ca_file = api.target.ca_file
    return ssl.create_default_context(cafile=ca_file) if ca_file else ssl.create_default_context()


def openai_client(api: Api) -> openai.OpenAI:
    import openai

    return openai.OpenAI(
        base_url=api.target.base_url + "/v1", api_key=api.target.api_key or "none",
        timeout=max(0.1, api.deadline.remaining()),
        max_retries=0, http_client=openai.DefaultHttpxClient(verify=_ssl_context(api)))


def anthropic_client(api: Api) -> anthropic.Anthropic:
    import anthropic

    return anthropic.Anthropic(
        base_url=api.target.base_url, auth_token=api.target.api_key or "none", api_key=None,
        timeout=api.target.timeout, max_retries=0, http_client=anthropic.DefaultHttpxClient(verify=_ssl_context(api)))


def _step(name: str, metrics: dict[str, Any], run: Callable[[], str]) -> None:
    """Run one client step; an SDK error fails the check naming the step and the SDK's own words."""
    import anthropic
    import openai

    try:
        metrics[name] = run()
    except CheckFailed:
        raise
    except (openai.APIConnectionError, anthropic.APIConnectionError) as exc:
        cause = exc.__cause__ or exc
        raise CheckFailed(f"{name}: could not connect: {short(str(cause), 240)}", metrics) from None
    except (openai.OpenAIError, anthropic.AnthropicError) as exc:
        raise CheckFailed(f"{name}: the SDK raised {type(exc).__name__}: {short(str(exc), 240)}", metrics) from None


def _chat(client: openai.OpenAI, model: str) -> str:
    reply = client.chat.completions.create(model=model, messages=[{"role": "user", "content": WHO_PROMPT}],
                                           max_tokens=SHORT_BUDGET, extra_body={"reasoning_effort": "low"})
    content = (reply.choices[0].message.content or "").strip()
    if not content:
        raise CheckFailed(f"openai chat: empty content (finish_reason {reply.choices[0].finish_reason})")
    return short(content, 60)


def _tool_round_trip(client: openai.OpenAI, model: str) -> str:
    from openai.types.chat import ChatCompletionMessageFunctionToolCall

    messages: list[Any] = [{"role": "user", "content": TOOL_TASK}]
    called: list[str] = []
    for _ in range(MAX_TOOL_TURNS):
        reply = client.chat.completions.create(model=model, messages=messages, tools=TOOLS,
                                               max_tokens=LONG_BUDGET, extra_body={"reasoning_effort": "high"})
        message = reply.choices[0].message
        if not message.tool_calls:
            answer = message.content or ""
            if "4183" not in answer.replace(",", ""):
                raise CheckFailed(f"openai tool round trip: the answer {short(answer, 120)!r} lacks 4183")
            return f"{', '.join(called)} then {short(answer, 60)!r}"
        # The whole turn goes back, reasoning included: the SDK keeps the engine's extra fields on the message.
        messages.append(assistant_turn(message.model_dump(exclude_none=True)))
        for call in message.tool_calls:
            if not isinstance(call, ChatCompletionMessageFunctionToolCall):
                raise CheckFailed(f"openai tool round trip: the model made a {call.type!r} tool call, not a function")
            name = call.function.name
            if name not in TOOL_IMPLS:
                raise CheckFailed(f"openai tool round trip: the model called {name!r}")
            try:
                args = json.loads(call.function.arguments)
            except ValueError:
                raise CheckFailed(f"openai tool round trip: the arguments of {name} are not JSON: "
                                  f"{short(call.function.arguments, 80)!r}") from None
            result = TOOL_IMPLS[name](**args)
            called.append(name)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": json.dumps(result)})
    raise CheckFailed(f"openai tool round trip: still calling tools after {MAX_TOOL_TURNS} turns")


def _stream(client: openai.OpenAI, model: str) -> str:
    chunks, text = 0, []
    stream = client.chat.completions.create(model=model, messages=[{"role": "user", "content": STREAM_PROMPT}],
                                            max_tokens=SHORT_BUDGET, stream=True,
                                            extra_body={"reasoning_effort": "low"})
    for chunk in stream:
        chunks += 1
        if chunk.choices and chunk.choices[0].delta.content:
            text.append(chunk.choices[0].delta.content)
    content = "".join(text).strip()
    if chunks < 2 or not content:
        raise CheckFailed(f"openai stream: {chunks} chunk(s), content {short(content, 60)!r}")
    return f"{chunks} chunks, {short(content, 40)!r}"


def _message(client: anthropic.Anthropic, model: str) -> str:
    reply = client.messages.create(model=model, max_tokens=SHORT_BUDGET,
                                   messages=[{"role": "user", "content": ANTHROPIC_PROMPT}])
    text = " ".join(b.text for b in reply.content if b.type == "text").strip()
    if not text:
        raise CheckFailed(f"anthropic message: no text block (blocks {[b.type for b in reply.content]})")
    return short(text, 60)


def check_clients(api: Api) -> tuple[str, dict[str, Any]]:
    import anthropic
    import openai

    model = api.target.model
    metrics: dict[str, Any] = {"openai": openai.__version__, "anthropic": anthropic.__version__}
    with openai_client(api) as oa:
        _step("openai chat", metrics, lambda: _chat(oa, model))
        _step("openai tool round trip", metrics, lambda: _tool_round_trip(oa, model))
        _step("openai stream", metrics, lambda: _stream(oa, model))
    with anthropic_client(api) as an:
        _step("anthropic message", metrics, lambda: _message(an, model))
    return (f"openai {openai.__version__} (chat, tool round trip, stream) and anthropic {anthropic.__version__} "
            "(message) accept every answer"), metrics
