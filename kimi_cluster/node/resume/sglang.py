"""Resumed streams on SGLang replicas: SGLang's own chat layer on the front (kimi_cluster/node/sglang_chat.py) and
the replicas' token door, `POST /generate`.

SGLang 0.5.23 has no render server; its chat route is Python that runs on a CPU. So the front runs it
(`sglang_chat.py`, in the replicas' own image) as vLLM's render server runs beside this layer, and calls it the same
way (render.py): `/v1/chat/completions/render` turns the client's body into SGLang's GenerateReqInput (the prompt's
token ids, the sampling parameters the chat route adds, `require_reasoning`) and opens the stream's state there; each
token chunk is posted to `/v1/chat/completions/derender`, where SGLang's own chat stream, with its reasoning and
tool-call parsers, kept for the whole stream, makes the chat chunks. A lost replica's generation carries on on the
twin (generation.py, SGLANG_DOOR) from the prompt plus every token delivered, once
`/v1/chat/completions/resume` says it can exactly: SGLang restarts a request's grammar at its first token, so a
tool turn's structural tag (which SGLang puts on every Kimi K3 turn that offers tools) allows a cut only before
the tools section opens, and never inside a stop string or a reasoning end.

Unlike vLLM's, this chat layer holds each stream's state (its parsers); a chat layer that restarted mid-stream has
lost it, and the stream ends with an error event, as a stream that is not resumed does when its replica is lost.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import request
from .generation import SGLANG_DOOR, Generation, Unavailable, UpstreamError
from .pool import log
from .render import RenderServers

RENDER_PATH = "/v1/chat/completions/render"
DERENDER_PATH = "/v1/chat/completions/derender"
RESUME_PATH = "/v1/chat/completions/resume"
# Fields whose request SGLang constrains (a grammar restarts at a cut) or answers per replica (logprobs, usage per
# chunk), which the front's chat layer cannot carry across a cut.
REFUSED_FIELDS = ("response_format", "regex", "ebnf", "json_schema", "structural_tag", "logprobs", "stop_regex",
                  "max_thinking_tokens", "thinking_budget", "return_hidden_states", "return_routed_experts")


def not_resumable(body: dict[str, Any], path: str) -> str | None:
    """Why a streamed request to an SGLang replica cannot be resumed exactly, read from its body, or None."""
    if path != "/v1/chat/completions":
        return "SGLang's Messages route is served by its replica as it is"
    if (body.get("n") or 1) != 1:
        return "n > 1"
    for name in REFUSED_FIELDS:
        value = body.get(name)
        if value not in (None, False) and not (name == "response_format" and isinstance(value, dict)
                                               and value.get("type") in (None, "text")):
            return f"{name} (SGLang constrains or reports it per replica)"
    choice = body.get("tool_choice")
    if choice == "required" or isinstance(choice, dict):
        return "a forced tool_choice (a grammar that restarts at a cut)"
    if request.wants(body.get("stream_options"), "continuous_usage_stats"):
        return "continuous usage stats"
    return None


class SglangDerender:
    """One stream through the front's SGLang chat layer (chat.Derender)."""

    def __init__(self, render: RenderServers, rendered: dict[str, Any], timeout_s: float) -> None:
        self.render, self.timeout_s = render, timeout_s
        self.key = rendered["stream"]
        self.request = dict(rendered["generate"], stream=True)

    def generation(self, front: Any, waiting: Callable[[float], None]) -> Generation:
        return Generation(front.pool, self.request, front.limits, waiting, door=SGLANG_DOOR,
                          before_resume=self.before_resume)

    def before_resume(self, output: list[int]) -> dict[str, Any]:
        status, answer, raw = self.render.call(RESUME_PATH, {"stream": self.key, "output_ids": output},
                                               self.timeout_s)
        if status == 200 and isinstance(answer, dict):
            return {"require_reasoning": bool(answer.get("require_reasoning"))}
        why = _error(answer, raw)
        log(f"stream {self.key}: not resumed after {len(output)} tokens: {why}")
        raise Unavailable(f"the replica serving this stream was lost after {len(output)} tokens, and the stream cannot "
                          f"be resumed exactly: {why}")

    def derender(self, item: dict[str, Any], waiting: Callable[[], None]) -> list[dict[str, Any]]:
        if not item.get("choices"):
            return []  # the usage SGLang's chat stream makes comes with the finish
        choice = item["choices"][0]
        status, answer, raw = self.render.call(DERENDER_PATH, {
            "stream": self.key, "output_ids": choice.get("token_ids") or [],
            "finish": choice.get("sglang_finish") or ({"type": choice["finish_reason"]}
                                                      if choice.get("finish_reason") else None)}, self.timeout_s)
        if status != 200 or not isinstance(answer, dict):
            raise UpstreamError(status if status >= 400 else 502, raw)
        return list(answer.get("chunks") or [])


def _error(answer: Any, raw: bytes) -> str:
    if isinstance(answer, dict) and isinstance(answer.get("error"), dict):
        return str(answer["error"].get("message"))
    return raw[:200].decode("utf-8", "replace")
