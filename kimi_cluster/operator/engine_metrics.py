"""The engines' Prometheus counters as the status reads them: requests, prompt and generated tokens, summed over
label sets, under SGLang's, vLLM's and TokenSpeed's (smg gateway's) names."""

from __future__ import annotations

import math
import re
from typing import Any

# Prometheus counters the engines export on /metrics (SGLang with --enable-metrics; vLLM by default; TokenSpeed's smg
# gateway on its metrics listener, tokens as smg_router_tokens_total{token_type="input"|"output"}, which smg counts
# for streamed chat responses and Anthropic messages, not for non-streamed chat completions: its docs/metrics).
_REQUESTS = ("sglang:num_requests_total", "vllm:request_success_total", "smg_router_requests_total")
_PROMPT_TOKENS = ("sglang:prompt_tokens_total", "vllm:prompt_tokens_total", "smg_router_tokens_total:input")
_GEN_TOKENS = ("sglang:generation_tokens_total", "vllm:generation_tokens_total", "smg_router_tokens_total:output")
_BY_TOKEN_TYPE = "smg_router_tokens_total"
_TOKEN_TYPE = re.compile(r'token_type="([a-z_]+)"')
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+([0-9.eE+-]+|NaN)")


def _finite(text: str) -> float | None:
    """A sample's value, or None unless it is a finite number: the engine writes /metrics, and one line of `.` or
    `1e999` (inf, which int() refuses) must not crash `status`."""
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def parse_metrics(text: str) -> dict[str, Any]:
    sums: dict[str, float] = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        value = _finite(match.group(3)) if match else None
        if match and value is not None:
            name = match.group(1)
            if name == _BY_TOKEN_TYPE:
                kind = _TOKEN_TYPE.search(match.group(2) or "")
                name = f"{name}:{kind.group(1) if kind else ''}"
            sums[name] = sums.get(name, 0.0) + value

    def first(names: tuple[str, ...]) -> int | None:
        # Finite samples can still sum past the largest float (two of 1e308): such a total is skipped as well.
        return next((int(sums[n]) for n in names if n in sums and math.isfinite(sums[n])), None)

    out = {"requests": first(_REQUESTS), "prompt_tokens": first(_PROMPT_TOKENS),
           "generation_tokens": first(_GEN_TOKENS)}
    return {k: v for k, v in out.items() if v is not None}
