"""How the fake inference server behaves (its engine shape, served names, key, faults), the error it answers
with, and the reply it composes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

DEFAULT_MODEL = "moonshotai/Kimi-K3.1-Pro"
ENGINES = ("sglang", "vllm", "tokenspeed")
EFFORTS = ("low", "high", "max")
# The effort of a request that names none, whichever door it comes in by (chat, messages, or the token door behind
# a render server): as a model's chat template holds its own default (kimi_cluster/fakes/tiny_model.py writes the
# effort into the prompt only when the request names one, as vLLM hands the template `reasoning_effort`).
DEFAULT_EFFORT = "max"

FAULTS: dict[str, str] = {
    "no_auth": "accept every request, with or without a key",
    "no_reasoning": "no reasoning field: the thinking lands inline in content, as without a reasoning parser",
    "bad_tool_args": "tool-call arguments that are not JSON",
    "wrong_model": "serve another model id than --served-model-name",
    "drop_reasoning": "ignore the reasoning of earlier assistant turns",
    "no_image": "refuse image input with HTTP 400",
    "server_error": "HTTP 500 on every generation request",
    "slow": "sleep --slow-seconds before answering every generation request",
}


class HttpError(Exception):
    """An answer other than 200, with the engine-style JSON error body."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class FakeSettings:
    """How the fake behaves; `faults` names entries of FAULTS."""

    engine: str = "sglang"
    served_model_names: tuple[str, ...] = (DEFAULT_MODEL,)
    api_key: str | None = field(default=None, repr=False)
    max_model_len: int = 1048576
    faults: frozenset[str] = frozenset()
    slow_seconds: float = 30.0
    # Decode time per generated token (FAKE_ENGINE_TOKEN_SECONDS): a stream is paced by it and a non-streamed
    # answer comes after all of it, as on a real engine, so that load tests have requests in flight.
    token_seconds: float = 0.0
    # vLLM's scale-out endpoints (the token API `/inference/v1/generate`): `vllm serve` answers them 403 unless
    # started with --enable-scale-out (vLLM 0.33.0, vllm/entrypoints/scale_out/factories.py).
    scale_out: bool = False
    # SGLang's --incremental-streaming-output: /generate streams disjoint deltas, not the cumulative output.
    incremental_streaming_output: bool = False

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise ValueError(f"engine must be one of {ENGINES}, got {self.engine!r}")
        unknown = sorted(set(self.faults) - set(FAULTS))
        if unknown:
            raise ValueError(f"unknown fault(s) {unknown}; known: {', '.join(FAULTS)}")
        if not self.served_model_names:
            raise ValueError("at least one served model name is needed")

    @property
    def reasoning_field(self) -> str:
        return "reasoning" if self.engine == "vllm" else "reasoning_content"

    @property
    def accepted_reasoning_fields(self) -> tuple[str, ...]:
        # vLLM takes either name back in; SGLang and smg read only their own
        return ("reasoning", "reasoning_content") if self.engine == "vllm" else ("reasoning_content",)

    @property
    def model_ids(self) -> tuple[str, ...]:
        if "wrong_model" not in self.faults:
            return self.served_model_names
        wrong = []
        for name in self.served_model_names:
            alias = name.rsplit("/", 1)[-1].lower()
            wrong.append(alias if alias != name else name + "-other")
        return tuple(wrong)


@dataclass
class Reply:
    reasoning: str
    content: str | None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)

    @property
    def finish_reason(self) -> str:
        return "tool_calls" if self.tool_calls else "stop"
