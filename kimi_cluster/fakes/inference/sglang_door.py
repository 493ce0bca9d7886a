"""SGLang 0.5.23's token door as the fake's SGLang shape serves it: `POST /generate` (token ids in, `output_ids`
out) and `POST /v1/tokenize` with `messages` (the prompt's tokens).

- `/generate` checks its body as SGLang's contract does (sglang/srt/entrypoints/api_contract.py, `GenerateRequest`
  in sglang/api/v1/api_types.py): top-level keys it does not know are ignored, a `sampling_params` key it does not
  know is a 400 `{"error": "unknown field ..."}` in serde's words; `max_new_tokens` defaults to 128.
- Its stream is one `data:` event per token, then `data: [DONE]` (sglang/srt/entrypoints/http_server.py). Each
  event is a GenerateResponse: `text`, `output_ids`, `meta_info` (`id`, `finish_reason` null until the end, then
  `{"type": "stop", "matched": ...}` or `{"type": "length", "length": N}`, `prompt_tokens`, `completion_tokens`),
  `index`. By default `text` and `output_ids` are cumulative, as SGLang streams them; with
  `incremental_streaming_output` (SGLang's `--incremental-streaming-output`) each event carries only its delta.
- Stop strings end the generation where SGLang's scheduler would: when the decoded output ends with one. The ids
  keep every token generated; the text is trimmed at the stop string (unless `no_stop_trim`), as SGLang's
  detokenizer does (`trim_matched_stop`).

The "model" is the same as the vLLM door's (generate.py): the scripted turn in Kimi K3's XTML, carried on from
whatever of it the prompt already holds, so a generation cut anywhere and continued elsewhere is the uncut one.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

from kimi_cluster.fakes import tiny_model

from . import generate
from .settings import FakeSettings, HttpError

PATH = "/generate"
TOKENIZE_PATHS = ("/v1/tokenize", "/tokenize")
DEFAULT_MAX_NEW_TOKENS = 128  # sglang/srt/sampling/sampling_params.py
# SGLang 0.5.23's SamplingParams fields (sglang/api/v1/api_types.py, _FIELDS_SamplingParams), in its order.
SAMPLING_FIELDS = ("max_new_tokens", "stop", "stop_token_ids", "stop_regex", "temperature", "top_p", "top_k",
                   "min_p", "frequency_penalty", "presence_penalty", "repetition_penalty", "min_new_tokens", "n",
                   "json_schema", "regex", "ebnf", "structural_tag", "ignore_eos", "skip_special_tokens",
                   "spaces_between_special_tokens", "no_stop_trim", "stream_interval", "logit_bias",
                   "sampling_seed", "custom_params", "beam_width", "watermark", "choice")


class ContractError(HttpError):
    """SGLang's 400 for a body its contract refuses: `{"error": <text>}`."""

    def __init__(self, message: str) -> None:
        super().__init__(400, message)


def _unknown_field(key: str) -> ContractError:
    listed = ", ".join(f"`{name}`" for name in SAMPLING_FIELDS)
    return ContractError(f"unknown field `{key}`, expected one of {listed}")


def request_fields(body: dict[str, Any]) -> tuple[list[int], dict[str, Any], bool, str]:
    """(input_ids, sampling_params, stream, rid) of a /generate body, refused as SGLang refuses it."""
    ids = body.get("input_ids")
    if ids is None:
        raise HttpError(400, "this fake generates from input_ids only (send the prompt's token ids)")
    if not isinstance(ids, list) or not ids or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise ContractError("invalid type: expected a sequence of i64 for `input_ids`")
    if not all(0 <= i < tiny_model.VOCAB_SIZE for i in ids):
        raise HttpError(400, "input_ids holds a token id outside this model's vocabulary")
    params = body.get("sampling_params") or {}
    if not isinstance(params, dict):
        raise ContractError("invalid type: expected struct SamplingParams")
    for key in params:
        if key not in SAMPLING_FIELDS:
            raise _unknown_field(key)
    max_new = params.get("max_new_tokens")
    max_new = DEFAULT_MAX_NEW_TOKENS if max_new is None else max_new
    if not isinstance(max_new, int) or max_new < 0:
        raise HttpError(400, "max_new_tokens must be a non-negative integer")
    if (params.get("n") or 1) != 1:
        raise HttpError(400, "this fake samples one sequence per request")
    stop = params.get("stop")
    if stop is not None and not isinstance(stop, (str, list)):
        raise ContractError("invalid type: expected a string or a sequence of strings for `stop`")
    rid = body.get("rid")
    return ids, dict(params, max_new_tokens=max_new), bool(body.get("stream")), rid if isinstance(rid, str) else \
        uuid.uuid4().hex


def generated(body: dict[str, Any], settings: FakeSettings) -> tuple[list[int], dict[str, Any] | None, list[int],
                                                                        str]:
    """(output ids, finish reason, input ids, rid) of one /generate request: the scripted turn's tokens from where
    the prompt is, up to max_new_tokens, EOS or a stop string."""
    ids, params, _, rid = request_fields(body)
    left, _ = generate.continuation(ids, settings)
    stops = params.get("stop") or []
    stops = [stops] if isinstance(stops, str) else [s for s in stops if isinstance(s, str) and s]
    stop_ids = set(params.get("stop_token_ids") or ())
    out: list[int] = []
    finish: dict[str, Any] | None = None
    for token in left:
        if len(out) >= params["max_new_tokens"]:
            break
        out.append(token)
        if token == tiny_model.EOS_ID and not params.get("ignore_eos") or token in stop_ids:
            finish = {"type": "stop", "matched": token}
            break
        text = tiny_model.decode(out)
        matched = next((s for s in stops if text.endswith(s)), None)
        if matched is not None:
            finish = {"type": "stop", "matched": matched}
            break
    if finish is None:
        finish = {"type": "length", "length": params["max_new_tokens"]}
    return out, finish, ids, rid


def shown_text(out: list[int], finish: dict[str, Any] | None, no_stop_trim: bool) -> str:
    """The text SGLang's detokenizer shows for the output ids: specials kept (the chat route sends
    skip_special_tokens false for Kimi K3), the matched stop trimmed at the end."""
    matched = (finish or {}).get("matched")
    if isinstance(matched, int) and out and out[-1] == matched and not no_stop_trim:
        out = out[:-1]
    text = tiny_model.decode(out)
    if isinstance(matched, str) and not no_stop_trim and matched in text:
        text = text[:text.find(matched)]
    return text


def meta_info(rid: str, prompt_tokens: int, completion_tokens: int,
              finish: dict[str, Any] | None) -> dict[str, Any]:
    return {"id": rid, "finish_reason": finish, "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens, "cached_tokens": 0, "reasoning_tokens": 0,
            "weight_version": "default", "e2e_latency": 0.0}


def stream_events(body: dict[str, Any], settings: FakeSettings) -> Iterator[dict[str, Any]]:
    """SGLang's stream: one GenerateResponse a token, cumulative unless settings.incremental_streaming_output."""
    out, finish, ids, rid = generated(body, settings)
    _, params, _, _ = request_fields(body)
    incremental = settings.incremental_streaming_output
    shown = ""
    for i in range(1, len(out) + 1):
        last = i == len(out)
        text = shown_text(out[:i], finish if last else None, bool(params.get("no_stop_trim")))
        if not last and text.endswith("\ufffd"):
            text = shown  # a character still incomplete is held back, as SGLang's detokenizer does
        event = {"text": text[len(shown):] if incremental else text,
                 "output_ids": out[i - 1:i] if incremental else out[:i],
                 "meta_info": meta_info(rid, len(ids), i, finish if last else None), "index": 0}
        shown = text
        yield event


def whole(body: dict[str, Any], settings: FakeSettings) -> dict[str, Any]:
    out, finish, ids, rid = generated(body, settings)
    _, params, _, _ = request_fields(body)
    return {"text": shown_text(out, finish, bool(params.get("no_stop_trim"))), "output_ids": out,
            "meta_info": meta_info(rid, len(ids), len(out), finish), "index": 0}


def tokenize(body: dict[str, Any], settings: FakeSettings) -> dict[str, Any]:
    """`/v1/tokenize`: a `prompt` string's tokens, or the tokens of `messages` rendered as for a chat completion
    (sglang/srt/entrypoints/openai/serving_tokenize.py), by the tiny model's template."""
    if body.get("messages") is not None:
        if body.get("add_generation_prompt") is not None:
            # SGLang with a Python chat encoder (Kimi K3's) refuses the flag.
            raise HttpError(400, "add_generation_prompt is supported only with a Jinja chat template.")
        messages = body["messages"]
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            raise HttpError(400, "messages must be a list of objects")
        tokens = tiny_model.encode(tiny_model.render(messages, body.get("tools"), body.get("reasoning_effort")))
    elif isinstance(body.get("prompt"), str):
        tokens = tiny_model.encode(body["prompt"])
    else:
        raise HttpError(400, "give `prompt` or `messages`")
    return {"tokens": tokens, "count": len(tokens), "max_model_len": settings.max_model_len}
