"""vLLM's token door, `POST /inference/v1/generate` (vLLM 0.33.0, vllm/entrypoints/scale_out/token_in_token_out/):
token ids in, token ids out, as the fake's vLLM shape serves it.

The fake's "model" reads the prompt in the tiny model's chat format (kimi_cluster/fakes/tiny_model.py) back into
messages, composes the same scripted turn as its chat route (compose.py), and writes it in Kimi K3's XTML: the
think channel, the response channel, the tools channel with one `call` per tool call and one `argument` per
argument, then EOS. It is autoregressive as a model is: whatever follows the prompt's last assistant opening is the
part of its answer already generated, and it carries on from there. So a generation cut anywhere and continued on
another replica comes out as the uncut one, which is what the front's resuming layer relies on.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from typing import Any

from kimi_cluster.fakes import tiny_model

from .compose import compose_reply
from .settings import DEFAULT_EFFORT, FakeSettings, HttpError, Reply

PATH = "/inference/v1/generate"
_TURN = re.compile(r"<\|open\|>(?P<head>system|user|assistant|declare|effort|tool id=\"(?P<call>[^\"]*)\")"
                   r"<\|sep\|>(?P<body>.*?)<\|close\|>(?P<role>system|user|assistant|declare|effort|tool)<\|sep\|>",
                   re.S)
_CHANNEL = re.compile(r"<\|open\|>(think|response)<\|sep\|>(.*?)<\|close\|>\1<\|sep\|>", re.S)
_CALL = re.compile(r"<\|open\|>call tool=\"([^\"]*)\" index=\"\d+\" id=\"([^\"]*)\"<\|sep\|>(.*?)<\|close\|>call"
                   r"<\|sep\|>", re.S)


def conversation(prompt: str) -> tuple[list[dict[str, Any]], list[str], str]:
    """The messages, the offered tools' names and the reasoning effort of a prompt in the tiny model's chat format
    (the template's default effort when the prompt names none)."""
    messages: list[dict[str, Any]] = []
    tools: list[str] = []
    effort = DEFAULT_EFFORT
    for turn in _TURN.finditer(prompt):
        head, body = turn.group("head"), turn.group("body")
        if head == "effort":
            effort = body
        elif head == "declare":
            tools = [t.get("function", {}).get("name", "") for t in json.loads(body) if isinstance(t, dict)]
        elif head.startswith("tool"):
            messages.append({"role": "tool", "tool_call_id": turn.group("call"), "content": body})
        elif head == "assistant":
            channels = dict(_CHANNEL.findall(body))
            calls = [{"id": ident, "type": "function", "function": {"name": name, "arguments": args}}
                     for name, ident, args in _CALL.findall(body)]
            messages.append({"role": "assistant", "reasoning": channels.get("think", ""),
                             "content": channels.get("response"), "tool_calls": calls})
        else:
            messages.append({"role": head, "content": body})
    return messages, tools, effort


def xtml(reply: Reply) -> str:
    """The reply as Kimi K3 generates it (the markers vLLM's kimi_k3 parsers read), up to EOS."""
    text = f"<|open|>think<|sep|>{reply.reasoning}<|close|>think<|sep|>"
    if reply.content:
        text += f"<|open|>response<|sep|>{reply.content}<|close|>response<|sep|>"
    if reply.tool_calls:
        text += "<|open|>tools<|sep|>"
        for index, call in enumerate(reply.tool_calls, start=1):
            text += f"<|open|>call tool=\"{call['function']['name']}\" index=\"{index}\"<|sep|>"
            for key, value in json.loads(call["function"]["arguments"]).items():
                kind = "string" if isinstance(value, str) else "object"
                shown = value if isinstance(value, str) else json.dumps(value)
                text += f"<|open|>argument key=\"{key}\" type=\"{kind}\"<|sep|>{shown}<|close|>argument<|sep|>"
            text += "<|close|>call<|sep|>"
        text += "<|close|>tools<|sep|>"
    return text + "[EOS]"


def continuation(token_ids: list[int], settings: FakeSettings) -> tuple[list[int], int]:
    """(the tokens still to generate for this prompt, how many it has generated already)."""
    text = tiny_model.decode(token_ids)
    at = text.rfind(tiny_model.GENERATION_PROMPT)
    if at < 0:
        raise HttpError(400, "the prompt does not open an assistant turn (render it with the model's chat template)")
    prompt_ids = tiny_model.encode(text[:at + len(tiny_model.GENERATION_PROMPT)])
    messages, tools, effort = conversation(text[:at])
    answer = tiny_model.encode(xtml(compose_reply(messages, tools, effort, settings)))
    done = len(token_ids) - len(prompt_ids)
    return answer[done:], done


def request_fields(body: dict[str, Any]) -> tuple[list[int], int, bool, bool]:
    """(token_ids, max_tokens, stream, include_usage) of a GenerateRequest, refused as vLLM refuses them."""
    ids = body.get("token_ids")
    if not isinstance(ids, list) or not ids or not all(isinstance(i, int) and 0 <= i < tiny_model.VOCAB_SIZE
                                                       for i in ids):
        raise HttpError(400, "token_ids must be a non-empty list of token ids of this model's vocabulary")
    if (body.get("output_mode") or "tokens") != "tokens":
        raise HttpError(400, "this server answers output_mode 'tokens' only")
    params = body.get("sampling_params")
    if not isinstance(params, dict):
        raise HttpError(400, "sampling_params is required")
    if (params.get("n") or 1) != 1:
        raise HttpError(400, "this server samples one sequence per request")
    max_tokens = params.get("max_tokens")
    max_tokens = 16 if max_tokens is None else max_tokens  # SamplingParams' default
    if not isinstance(max_tokens, int) or max_tokens < 1:
        raise HttpError(400, "max_tokens must be at least 1")
    usage = bool((body.get("stream_options") or {}).get("include_usage"))
    return ids, max_tokens, bool(body.get("stream")), usage


def generate(body: dict[str, Any], settings: FakeSettings) -> tuple[list[int], str, dict[str, Any], str]:
    """(tokens, finish reason, usage, request id) of one GenerateRequest."""
    ids, max_tokens, _, _ = request_fields(body)
    left, _ = continuation(ids, settings)
    tokens = left[:max_tokens]
    finish = "stop" if tokens and tokens[-1] == tiny_model.EOS_ID else "length"
    usage = {"prompt_tokens": len(ids), "completion_tokens": len(tokens), "total_tokens": len(ids) + len(tokens)}
    return tokens, finish, usage, f"generate-tokens-{body.get('request_id') or uuid.uuid4().hex}"


def stream_events(body: dict[str, Any], settings: FakeSettings) -> Iterator[dict[str, Any]]:
    """vLLM's stream: one GenerateTokensStreamResponse per token (prompt_token_ids on the first when asked for),
    the finish on the last; the usage chunk when asked for."""
    tokens, finish, usage, request_id = generate(body, settings)
    _, _, _, include_usage = request_fields(body)
    for i, token in enumerate(tokens):
        last = i == len(tokens) - 1
        chunk: dict[str, Any] = {"request_id": request_id, "choices": [{
            "index": 0, "logprobs": None, "finish_reason": finish if last else None, "stop_reason": None,
            "token_ids": [token], "routed_experts": None, "sampling_mask": None, "weight_versions": None}],
            "usage": None}
        if i == 0 and body.get("return_token_ids"):
            chunk["prompt_token_ids"] = body["token_ids"]
        yield chunk
    if include_usage:
        yield {"request_id": request_id, "usage": usage, "output_mode": "tokens", "choices": []}


def whole(body: dict[str, Any], settings: FakeSettings) -> dict[str, Any]:
    """vLLM's GenerateTokensResponse."""
    tokens, finish, usage, request_id = generate(body, settings)
    return {"request_id": request_id, "usage": usage, "output_mode": "tokens",
            "prompt_token_ids": body["token_ids"] if body.get("return_token_ids") else None,
            "choices": [{"index": 0, "finish_reason": finish, "stop_reason": None, "token_ids": tokens,
                         "logprobs": None}]}
