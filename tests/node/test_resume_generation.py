"""The resuming layer's generation (kimi_cluster/node/resume/generation.py) against a scripted token server: cut at
every token, by a reset or by silence, the generation comes out as the uncut one, with the usage of the whole."""

from __future__ import annotations

import pytest

from kimi_cluster.node.resume.generation import Generation, Limits, Unavailable
from kimi_cluster.node.resume.pool import Pool
from tests.node.resume_fixtures import EOS, PROMPT_END, REPLY, CutProxy, token_server

pytestmark = pytest.mark.integration

PROMPT = [1, 5, 6, PROMPT_END]
QUICK = Limits(silence_s=0.3, tick_s=0.05, pick_s=5.0, resumes=3, connect_s=2.0)


def request(max_tokens: int = 64) -> dict:
    return {"request_id": "r1", "token_ids": PROMPT, "sampling_params": {"max_tokens": max_tokens, "temperature": 0.7},
            "stream": True, "stream_options": {"include_usage": True}}


def run(pool: Pool, max_tokens: int = 64) -> tuple[Generation, list[dict]]:
    generation = Generation(pool, request(max_tokens), QUICK)
    return generation, list(generation.chunks())


def tokens(chunks: list[dict]) -> list[int]:
    return [t for c in chunks for choice in c["choices"] for t in choice["token_ids"]]


def test_uncut_generation_is_the_replicas_answer() -> None:
    with token_server() as server:
        pool = Pool([server.url])
        generation, chunks = run(pool)
    assert tokens(chunks) == REPLY
    assert chunks[-1]["usage"] == {"prompt_tokens": 4, "completion_tokens": len(REPLY),
                                   "total_tokens": 4 + len(REPLY)}
    assert [c["choices"][0]["finish_reason"] for c in chunks[:-1]][-1] == "stop"
    assert generation.resumes == []


@pytest.mark.parametrize("mode", ["reset", "silence"])
def test_a_generation_cut_at_every_token_comes_out_whole(mode: str) -> None:
    with token_server() as server:
        for cut in range(len(REPLY)):
            proxy = CutProxy(server.url, cut_after=cut, mode=mode)
            pool = Pool([proxy.url, server.url], interval_s=0.05, timeout_s=0.1, fails=1, passes=2)
            pool.start()
            try:
                server.requests.clear()
                generation, chunks = run(pool)
            finally:
                pool.stop.set()
                proxy.close()
            assert tokens(chunks) == REPLY, f"cut after {cut} tokens ({mode})"
            assert chunks[-1]["usage"]["completion_tokens"] == len(REPLY)
            assert chunks[-1]["usage"]["prompt_tokens"] == len(PROMPT)
            assert len(generation.resumes) == 1 and generation.resumes[0].at_token == cut
            twin = server.requests[-1]
            # The twin gets the prompt and what was delivered, with max_tokens lowered by as much.
            assert twin["token_ids"] == PROMPT + REPLY[:cut]
            assert twin["sampling_params"] == {"max_tokens": 64 - cut, "temperature": 0.7}


def test_max_tokens_ends_a_resumed_generation_where_the_uncut_one_ends() -> None:
    with token_server() as server:
        proxy = CutProxy(server.url, cut_after=3)
        pool = Pool([proxy.url, server.url])
        try:
            _, chunks = run(pool, max_tokens=5)
        finally:
            proxy.close()
    assert tokens(chunks) == REPLY[:5]
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert EOS not in tokens(chunks)


def test_with_every_replica_lost_the_generation_says_so() -> None:
    with token_server() as server:
        proxy = CutProxy(server.url, cut_after=2)
        pool = Pool([proxy.url], interval_s=0.05, timeout_s=0.1, fails=1)
        pool.start()
        try:
            generation = Generation(pool, request(), Limits(silence_s=0.3, tick_s=0.05, pick_s=0.5))
            got = []
            with pytest.raises(Unavailable, match="no replica is healthy"):
                for chunk in generation.chunks():
                    got.append(chunk)
        finally:
            pool.stop.set()
            proxy.close()
    assert tokens(got) == REPLY[:2]
