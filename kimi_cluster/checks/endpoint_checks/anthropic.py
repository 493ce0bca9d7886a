"""The anthropic check: the Anthropic Messages route (/v1/messages) answers with a text block."""

from __future__ import annotations

import json
from typing import Any

from kimi_cluster.checks.client import Api, usage_of
from kimi_cluster.checks.prompts import ANTHROPIC_PROMPT, SHORT_BUDGET
from kimi_cluster.checks.results import CheckFailed
from kimi_cluster.checks.text import short


def check_anthropic(api: Api) -> tuple[str, dict[str, Any]]:
    # SGLang and vLLM check only `Authorization: Bearer` (which is what Claude Code sends for
    # ANTHROPIC_AUTH_TOKEN); x-api-key rides along for gateways that want the Anthropic style.
    headers = {"anthropic-version": "2023-06-01"}
    if api.target.api_key:
        headers["x-api-key"] = api.target.api_key
    data = api.json_ok(
        "POST",
        "/v1/messages",
        {
            "model": api.target.model,
            "max_tokens": SHORT_BUDGET,
            "messages": [{"role": "user", "content": ANTHROPIC_PROMPT}],
        },
        headers=headers,
    )
    blocks = data.get("content")
    if not isinstance(blocks, list):
        raise CheckFailed(f"/v1/messages answer has no content list: {short(json.dumps(data))}")
    types = [b.get("type") for b in blocks if isinstance(b, dict)]
    texts = [b.get("text", "") for b in blocks if isinstance(b, dict) and b.get("type") == "text"]
    metrics = {
        "block_types": types,
        "stop_reason": data.get("stop_reason"),
        "output_tokens": usage_of(data).get("output_tokens"),
    }
    text = " ".join(t for t in texts if isinstance(t, str)).strip()
    if not text:
        raise CheckFailed(f"/v1/messages answered without a non-empty text block (blocks: {types})", metrics)
    return f"text block {short(text, 80)!r}", metrics
