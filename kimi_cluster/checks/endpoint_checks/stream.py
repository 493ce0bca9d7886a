"""The stream check: a streamed chat completion arrives as SSE chunks ending in [DONE]; measures TTFT and speed."""

from __future__ import annotations

import json
import time
from typing import Any

from kimi_cluster.checks.client import Api
from kimi_cluster.checks.messages import REASONING_FIELDS
from kimi_cluster.checks.prompts import SHORT_BUDGET, STREAM_PROMPT
from kimi_cluster.checks.results import CheckFailed
from kimi_cluster.checks.text import short


def check_stream(api: Api) -> tuple[str, dict[str, Any]]:
    body = {
        "model": api.target.model,
        "messages": [{"role": "user", "content": STREAM_PROMPT}],
        "reasoning_effort": "low",
        "max_tokens": SHORT_BUDGET,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    start = time.monotonic()
    metrics: dict[str, Any] = {}
    first: float | None = None
    chunks = token_chunks = 0
    content: list[str] = []
    usage: dict[str, Any] = {}
    done = False
    with api.stream("POST", "/v1/chat/completions", body, "/v1/chat/completions (stream)") as stream:
        metrics["content_type"] = stream.headers.get("Content-Type")
        try:
            # real engines send chunked SSE, and urllib3 hands each chunk over as it arrives
            for line in stream.lines():
                if not line.startswith("data:"):
                    continue
                payload = line[len("data:"):].strip()
                if payload == "[DONE]":
                    done = True
                    break
                try:
                    chunk = json.loads(payload)
                except ValueError:
                    raise CheckFailed(f"an SSE chunk is not JSON: {short(payload, 120)!r}", metrics) from None
                chunks += 1
                if isinstance(chunk.get("usage"), dict):
                    usage = chunk["usage"]
                for choice in chunk.get("choices") or []:
                    delta = choice.get("delta") or {}
                    pieces = [delta.get(k) for k in ("content",) + REASONING_FIELDS]
                    if any(isinstance(p, str) and p for p in pieces):
                        token_chunks += 1
                        if first is None:
                            first = time.monotonic()
                    if isinstance(delta.get("content"), str):
                        content.append(delta["content"])
        except CheckFailed as exc:
            raise CheckFailed(f"{exc.reason} (after {chunks} chunks)", dict(metrics, chunks=chunks)) from exc
        end = time.monotonic()
    metrics["chunks"] = chunks
    if first is None:
        raise CheckFailed(f"the stream delivered {chunks} chunks but none carried content or reasoning", metrics)
    if not done:
        raise CheckFailed(f"the stream ended after {chunks} chunks without data: [DONE]", metrics)
    text = "".join(content).strip()
    if not text:
        raise CheckFailed("the stream carried reasoning but no answer content", metrics)
    tokens = usage.get("completion_tokens") or token_chunks
    generation_s = end - first
    metrics.update({
        "ttft_s": round(first - start, 4),
        "completion_tokens": tokens,
        "tokens_per_s": round(tokens / generation_s, 2) if generation_s > 0 else None,
    })
    return (
        f"{chunks} chunks, time to first token {metrics['ttft_s']:.2f}s, "
        f"{metrics['tokens_per_s']} tokens/s",
        metrics,
    )
