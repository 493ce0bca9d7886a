"""The resuming layer's SGLang door (kimi_cluster/node/resume/generation.py SGLANG_DOOR, sglang.py) against the fake
engine's SGLang `/generate`: cut at every token, by a reset or by silence, with SGLang's cumulative `output_ids` and
with its disjoint ones (`--incremental-streaming-output`), the generation comes out as the uncut one; the twin gets
the prompt and the tokens so far, its `max_new_tokens` lowered by as many, a rid of its own and what the chat layer
said of the cut; a cut the chat layer refuses ends the generation. SGLang's own chat route over these tokens is
tested in tests/engine_parsers/test_sglang_resume.py."""

from __future__ import annotations

from typing import Any

import pytest

from kimi_cluster.fakes import tiny_model
from kimi_cluster.fakes.inference import sglang_door
from kimi_cluster.fakes.inference.server import FakeInferenceServer
from kimi_cluster.fakes.inference.settings import FakeSettings
from kimi_cluster.node.resume import sglang
from kimi_cluster.node.resume.generation import SGLANG_DOOR, Generation, Limits, Unavailable
from kimi_cluster.node.resume.pool import Pool
from tests.node.resume_stand_ins import CutProxy

pytestmark = pytest.mark.integration

QUICK = Limits(silence_s=0.3, tick_s=0.05, pick_s=5.0, resumes=3, connect_s=2.0)
PROMPT = tiny_model.encode(tiny_model.render([{"role": "user", "content": "Say hello."}]))


def request(max_new_tokens: int = 1000) -> dict[str, Any]:
    return {"rid": "kimi-r1", "input_ids": PROMPT, "stream": True, "require_reasoning": True,
            "sampling_params": {"max_new_tokens": max_new_tokens, "skip_special_tokens": False}}


def tokens(chunks: list[dict[str, Any]]) -> list[int]:
    return [t for c in chunks for choice in c["choices"] for t in choice["token_ids"]]


@pytest.mark.parametrize("incremental", [False, True])
@pytest.mark.parametrize("mode", ["reset", "silence"])
def test_an_sglang_generation_cut_anywhere_comes_out_whole(mode: str, incremental: bool) -> None:
    settings = FakeSettings(engine="sglang", incremental_streaming_output=incremental)
    whole, finish, _, _ = sglang_door.generated(request(), settings)
    asked: list[int] = []

    def before_resume(output: list[int]) -> dict[str, Any]:
        asked.append(len(output))
        return {"require_reasoning": False}

    with FakeInferenceServer(settings) as lost, FakeInferenceServer(settings) as twin:
        for cut in (0, 1, 7, len(whole) // 2, len(whole) - 1):
            proxy, recorder = CutProxy(lost.url, cut_after=cut, mode=mode), CutProxy(twin.url, cut_after=None)
            pool = Pool([proxy.url, recorder.url], interval_s=0.05, timeout_s=0.1, fails=1, passes=2)
            pool.start()
            try:
                generation = Generation(pool, request(), QUICK, door=SGLANG_DOOR, before_resume=before_resume)
                chunks = list(generation.chunks())
            finally:
                pool.stop.set()
                proxy.close()
                recorder.close()
            assert tokens(chunks) == whole, f"cut after {cut} tokens ({mode})"
            assert chunks[-2]["choices"][0]["sglang_finish"] == finish and finish["type"] == "stop"
            assert chunks[-1]["usage"] == {"prompt_tokens": len(PROMPT), "completion_tokens": len(whole),
                                           "total_tokens": len(PROMPT) + len(whole)}
            carried = recorder.requests[-1]
            made = generation.resumes[0].at_token
            assert carried["input_ids"] == PROMPT + whole[:made]
            assert carried["sampling_params"]["max_new_tokens"] == 1000 - made
            if made:
                assert carried["rid"] == "kimi-r1-resume1" and carried["require_reasoning"] is False
            else:  # nothing was delivered: the same request, as it was
                assert carried == request()
    assert asked and 0 not in asked


def test_a_cut_the_chat_layer_refuses_ends_the_generation() -> None:
    settings = FakeSettings(engine="sglang")

    def refuse(output: list[int]) -> dict[str, Any]:
        raise Unavailable(f"cannot carry on after {len(output)} tokens")

    with FakeInferenceServer(settings) as lost, FakeInferenceServer(settings) as twin:
        proxy = CutProxy(lost.url, cut_after=20)
        pool = Pool([proxy.url, twin.url], interval_s=0.05, timeout_s=0.1, fails=1, passes=2)
        pool.start()
        try:
            generation = Generation(pool, request(), QUICK, door=SGLANG_DOOR, before_resume=refuse)
            with pytest.raises(Unavailable, match="after 20 tokens"):
                list(generation.chunks())
        finally:
            pool.stop.set()
            proxy.close()


def test_the_door_reads_cumulative_and_incremental_output_ids() -> None:
    cumulative = {"output_ids": [5, 6, 7], "meta_info": {"id": "r", "completion_tokens": 3, "finish_reason": None}}
    delta = {"output_ids": [7], "meta_info": {"id": "r", "completion_tokens": 3, "finish_reason": None}}
    assert SGLANG_DOOR.chunk(cumulative, 2)["choices"][0]["token_ids"] == [7]
    assert SGLANG_DOOR.chunk(delta, 2)["choices"][0]["token_ids"] == [7]
    first = {"output_ids": [5], "meta_info": {"id": "r", "completion_tokens": 1,
                                              "finish_reason": {"type": "length", "length": 1}}}
    assert SGLANG_DOOR.chunk(first, 0)["choices"][0] == {"index": 0, "token_ids": [5], "finish_reason": "length",
                                                         "sglang_finish": {"type": "length", "length": 1}}


@pytest.mark.parametrize(("body", "why"), [
    ({"n": 2}, "n > 1"),
    ({"response_format": {"type": "json_object"}}, "response_format"),
    ({"regex": "a+"}, "regex"),
    ({"logprobs": True}, "logprobs"),
    ({"tool_choice": "required"}, "forced tool_choice"),
    ({"stream_options": {"continuous_usage_stats": True}}, "continuous usage"),
])
def test_requests_sglang_cannot_carry_on_exactly_are_named(body: dict[str, Any], why: str) -> None:
    assert why in (sglang.not_resumable(body, "/v1/chat/completions") or "")
    assert sglang.not_resumable({"response_format": {"type": "text"}, "stop": ["x"], "tools": []},
                                "/v1/chat/completions") is None
    assert "Messages" in (sglang.not_resumable({}, "/v1/messages") or "")
