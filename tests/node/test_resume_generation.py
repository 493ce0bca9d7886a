"""The resuming layer's generation (kimi_cluster/node/resume/generation.py) against a scripted token server: cut at
every token, by a reset or by silence, the generation comes out as the uncut one, with the usage of the whole."""

from __future__ import annotations

import pytest

from kimi_cluster.node.resume.generation import Generation, Limits, Unavailable
from kimi_cluster.node.resume.pool import Pool
from tests.node.resume_stand_ins import EOS, PROMPT_END, REPLY, CutProxy, token_server

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


def test_a_new_replica_list_from_the_file_takes_effect_with_no_restart(tmp_path) -> None:
    """The step rewrites the replicas file when a replica comes back at a new address: the running layer reads it,
    the new replica takes requests once its health check passes, the old one takes none, and a request running on
    a replica that stays goes on."""
    import threading

    from kimi_cluster.node.resume import server

    with token_server() as first, token_server() as second:
        listed = tmp_path / "replicas"
        listed.write_text(f"{first.url}\n")
        args = server.parse(["--listen", "127.0.0.1:0", "--render", "http://127.0.0.1:9", "--replicas-file",
                             str(listed), "--health-interval-s", "0.05", "--health-passes", "1"])
        front = server.build(args)
        pool = front.front.pool
        pool.start()
        threading.Thread(target=server.follow, args=(pool, str(listed), 0.05), daemon=True).start()
        try:
            held = pool.pick()
            assert held is not None and held.url == first.url
            listed.write_text(f"# re-created\n{second.url}\n")
            with pool.changed:  # set_urls and every health answer notify it
                assert pool.changed.wait_for(lambda: [r.url for r in pool.replicas] == [second.url]
                                             and pool.replicas[0].healthy, timeout=30)
            picked = pool.pick(wait_s=30)
            assert picked is not None and picked.url == second.url
            pool.release(held)  # the request on the replica that went finishes as it was
            pool.release(picked)
            listed.write_text("not a url\n")  # refused: `follow` keeps the list it had
            with pytest.raises(ValueError):
                server.read_replicas(str(listed))
        finally:
            pool.stop.set()
            front.server_close()
    with pytest.raises(SystemExit):
        server.parse(["--render", "http://127.0.0.1:9"])  # no replicas at all
