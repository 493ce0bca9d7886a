"""The front's resuming layer over vLLM's real chat layer: vLLM's render server (`vllm launch render`, on this CPU,
with the Kimi K3 parsers), the fake engine's token door as two replicas, and kimi_cluster/node/resume between them.

A streamed tool-call turn with reasoning is cut after every one of its tokens, by a reset, and each cut stream,
assembled by the official `openai` SDK's accumulator, is the uncut one: reasoning, content, the tool call's name
and arguments, its id the same from its first delta to its last, the finish reason, and the usage (the original
prompt's tokens and every generated one). Through the HTTP server with the official clients, a cut by silence and
an Anthropic Messages stream (assembled by `anthropic`'s MessageStream) come out whole too; and every request the
twin receives is a valid vLLM GenerateRequest (checked by vLLM's own model, in the parsers' venv).
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import anthropic
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from kimi_cluster.checks.tools import TOOLS
from kimi_cluster.fakes.inference import generate
from kimi_cluster.fakes.inference.server import FakeInferenceServer
from kimi_cluster.fakes.inference.settings import DEFAULT_MODEL, FakeSettings
from kimi_cluster.node.resume import chat, wire
from kimi_cluster.node.resume.generation import Limits
from tests.engine_parsers.render_server import VENV, render_server
from tests.node.resume_fixtures import QUICK_TO_NOTICE, Recorder, Served, assembled, layer_over, through_layer
from tests.node.resume_stand_ins import CutProxy, RestartingServer

pytestmark = pytest.mark.integration

if not (VENV / "bin" / "vllm").exists():
    reason = f"vLLM is not installed at {VENV}: bash tests/engine_parsers/install.sh"
    if os.environ.get("CI"):
        raise RuntimeError(reason)
    pytest.skip(reason, allow_module_level=True)

QUICK = Limits(silence_s=0.3, tick_s=0.05, pick_s=10.0, resumes=3, connect_s=2.0)
# "low": the render server writes it into the prompt and the token door reads it back (a short turn, cut at each of
# its tokens below).
TOOL_MESSAGES: list[ChatCompletionMessageParam] = [
    {"role": "user", "content": "What is the weather in Oslo? Use the tool."}]
TOOL_TURN = {"model": DEFAULT_MODEL, "stream": True, "max_tokens": 1000, "tools": TOOLS, "reasoning_effort": "low",
             "stream_options": {"include_usage": True}, "messages": TOOL_MESSAGES}
# 2 ms a token: the derender calls (a few ms each) take a few tokens at a time, so cuts fall on varied chunk
# boundaries of the stream state vLLM replays.
SETTINGS = FakeSettings(engine="vllm", token_seconds=0.002, scale_out=True)


@pytest.fixture(scope="module")
def render(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    with render_server(tmp_path_factory.mktemp("render")) as url:
        yield wire.address(url)


def answer_of(client: Recorder) -> dict[str, Any]:
    """The assembled message and finish reason of a stream. A tool-only turn's content is "" from `vllm serve`,
    whose first chunk opens with it, and null from vLLM's derender, which sends the role with the first text
    (vllm/renderers/online_derenderer.py): vLLM's own difference, so both count as no content here."""
    got, _ = assembled(client.data)
    return {"message": dict(got["message"], content=got["message"]["content"] or None), "finish": got["finish"]}


def run(renders: list[tuple[str, int]], body: dict[str, Any], replicas: list[str]) -> Recorder:
    return through_layer(renders, body, replicas, QUICK)


# A full request through the render server per token: some 3 minutes alone, twice that beside the flows.
@pytest.mark.timeout(900)
@pytest.mark.long
def test_a_tool_call_stream_cut_after_every_token_is_the_uncut_one(render: tuple[str, int]) -> None:
    with FakeInferenceServer(SETTINGS) as lost, FakeInferenceServer(SETTINGS) as twin:
        uncut, uncut_ids = assembled(run([render], TOOL_TURN, [twin.url]).data)
        assert uncut["finish"] == "tool_calls" and uncut["message"]["reasoning"]
        assert uncut["message"]["tool_calls"][0]["function"] == {"name": "get_weather",
                                                                 "arguments": '{"city": "Oslo"}',
                                                                 "parsed_arguments": None}
        assert len(uncut_ids) == 1
        total = uncut["usage"]["completion_tokens"]

        def cut_at(position: int) -> str | None:
            proxy = CutProxy(lost.url, cut_after=position)
            try:
                got, ids = assembled(run([render], TOOL_TURN, [proxy.url, twin.url]).data)
            finally:
                proxy.close()
            if not proxy.lost.is_set():
                return f"cut {position}: never cut"
            if got != uncut or len(ids) != 1:
                return f"cut {position}: {got} with ids {ids}, not {uncut}"
            return None

        with ThreadPoolExecutor(3) as pool:
            wrong = [w for w in pool.map(cut_at, range(total)) if w]
    assert total > 100 and wrong == [], wrong[:3]


def test_a_render_server_away_or_replaced_loses_nothing(render: tuple[str, int]) -> None:
    """A render server that restarts mid-stream (a crash: docker restarts its container) holds the stream's chunks
    until it is back (each derender call carries the whole stream), and the stream comes out as the uncut one. An
    image change starts the new server on the other port while the old one serves: when the old one goes, the calls
    go on to the new one at once. A stream that starts while no server answers is served unresumed: the same
    answer, from the replica's own chat endpoint, at any effort."""
    with FakeInferenceServer(SETTINGS) as replica:
        uncut_run = run([render], TOOL_TURN, [replica.url])
        uncut, _ = assembled(uncut_run.data)
        # Connection 1 renders the prompt; 2 onwards derender chunks: 10 of those find no server.
        restarting = RestartingServer(render, down_from=6, down_to=15)
        # The old server is removed after 5 calls; the new one, on the other port, answers every call it gets.
        old, new = RestartingServer(render, down_from=6, down_to=10**9), RestartingServer(render, 1, 0)
        away = RestartingServer(render, down_from=1, down_to=10**9)
        try:
            got, ids = assembled(run([restarting.address], TOOL_TURN, [replica.url]).data)
            swapped, swapped_ids = assembled(run([old.address, new.address], TOOL_TURN, [replica.url]).data)
            # The fake's chat endpoint counts words for usage, not tokens: the answers are compared without it.
            unresumed = {effort: answer_of(run([away.address], dict(TOOL_TURN, reasoning_effort=effort),
                                               [replica.url])) for effort in ("low", None)}
            resumed_max = answer_of(run([render], dict(TOOL_TURN, reasoning_effort=None), [replica.url]))
        finally:
            for server in (restarting, old, new, away):
                server.close()
    assert restarting.refused == 10 and got == uncut and len(ids) == 1, got
    # One call found the old server gone; every later one went straight to the new one.
    assert old.seen == 6 and old.refused == 1 and new.refused == 0 and new.seen > 1, (old.seen, new.seen)
    assert swapped == uncut and len(swapped_ids) == 1, swapped
    assert away.refused == away.seen == 2, away.seen  # not rendered: straight to the replica's own chat
    # The replica's chat endpoint answers as its token door does behind the render server: at the effort named,
    # and at the template's own default when none is.
    assert unresumed["low"] == answer_of(uncut_run), unresumed["low"]
    assert unresumed[None] == resumed_max != unresumed["low"], unresumed[None]


def test_a_replica_without_the_token_api_gets_the_stream_at_its_chat_endpoint(render: tuple[str, int]) -> None:
    """A replica started without --enable-scale-out (one the 0.3.0 upgrade has not restarted yet) answers the token
    API 403, as vLLM does: the stream goes to its chat endpoint instead, unresumed but whole."""
    old = FakeSettings(engine="vllm", token_seconds=0.002)
    with FakeInferenceServer(old) as replica:
        got, _ = assembled(run([render], TOOL_TURN, [replica.url]).data)
    assert got["finish"] == "tool_calls" and got["message"]["tool_calls"], got


@pytest.fixture
def front(render: tuple[str, int]) -> Iterator[Served]:
    with layer_over(render, SETTINGS, *QUICK_TO_NOTICE) as served:
        yield served


# vLLM's own request and response models, in the parsers' venv: each JSON line is (model name, payload).
_VALIDATE = """
import json, sys
from vllm.entrypoints.scale_out.token_in_token_out import protocol
for line in sys.stdin:
    name, payload = json.loads(line)
    try:
        getattr(protocol, name).model_validate(payload)
    except Exception as exc:
        print(name, str(exc).splitlines()[0], json.dumps(payload)[:300])
"""


def vllm_refuses(items: list[tuple[str, dict]]) -> str:
    """What vLLM's own models refuse among (model name, payload) pairs: '' when all pass."""
    lines = "\n".join(json.dumps(item) for item in items)
    done = subprocess.run([str(VENV / "bin" / "python"), "-c", _VALIDATE], input=lines, capture_output=True,
                          text=True, timeout=600, env={**os.environ, "VLLM_TARGET_DEVICE": "cpu"})
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


@pytest.mark.parametrize("mode", ["reset", "silence"])
def test_the_openai_client_gets_a_whole_stream_across_a_loss(front, mode: str) -> None:
    url, proxy, twin = front
    proxy.mode, proxy.cut_after = mode, 60
    client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
    with client.chat.completions.stream(model=DEFAULT_MODEL, max_tokens=1000, tools=TOOLS, messages=TOOL_MESSAGES,
                                        stream_options={"include_usage": True}) as stream:
        for _ in stream:
            pass
        choice = stream.get_final_completion().choices[0]
    assert proxy.lost.is_set()
    assert choice.finish_reason == "tool_calls"
    assert choice.message.tool_calls and choice.message.tool_calls[0].function.arguments == '{"city": "Oslo"}'
    # The twin carried on from the prompt and the 60 tokens delivered, with max_tokens lowered by as many.
    carried = twin.requests[-1]
    assert carried["sampling_params"]["max_tokens"] == 1000 - 60
    # Everything the twin was sent is a request vLLM's own model takes, and what the fake streams back is a chunk
    # its own model takes.
    chunks = [("GenerateTokensStreamResponse", c) for c in generate.stream_events(carried, SETTINGS)]
    assert vllm_refuses([("GenerateRequest", r) for r in twin.requests] + chunks) == ""


@pytest.mark.parametrize("mode", ["reset", "silence"])
def test_the_anthropic_client_gets_a_whole_stream_across_a_loss(front, mode: str) -> None:
    url, proxy, twin = front
    proxy.mode, proxy.cut_after = mode, 40
    claude = anthropic.Anthropic(base_url=url, api_key="x", max_retries=0)
    weather = next(t["function"] for t in TOOLS if t["function"]["name"] == "get_weather")
    with claude.messages.stream(model=DEFAULT_MODEL, max_tokens=1000, tools=[{
            "name": "get_weather", "description": weather["description"], "input_schema": weather["parameters"]}],
            messages=[{"role": "user", "content": "What is the weather in Oslo? Use the tool."}]) as message_stream:
        final = message_stream.get_final_message()
    assert proxy.lost.is_set()
    assert [block.type for block in final.content] == ["thinking", "tool_use"]
    call = final.content[1]
    assert isinstance(call, anthropic.types.ToolUseBlock) and call.input == {"city": "Oslo"}
    assert final.stop_reason == "tool_use"
    assert twin.requests[-1]["sampling_params"]["max_tokens"] == 1000 - 40
    assert vllm_refuses([("GenerateRequest", r) for r in twin.requests]) == ""


def test_the_derender_parses_with_the_parse_context_as_with_the_whole_body(render: tuple[str, int]) -> None:
    """The derender is sent the render's parse context and the body's decoding switches, not the body (issue 52:
    a client's 2 MB field was carried on every call). vLLM's real render server derenders a tool-call turn with
    reasoning chunk by chunk to the same chunks from either, and a stream with a 2 MB junk field comes out as the
    one without."""
    status, rendered, _ = wire.call_json(*render, chat.RENDER_PATH, TOOL_TURN, 120)
    assert status == 200
    framing = chat.ChatFraming(TOOL_TURN, rendered)
    chunks = list(generate.stream_events(dict(rendered, stream_options={"include_usage": True}), SETTINGS))

    def derendered(request_of: Any) -> list[list[dict[str, Any]]]:
        state, out = None, []
        for item in chunks:
            finishing = any(c.get("finish_reason") == "stop" for c in item.get("choices") or ())
            status, answer, raw = wire.call_json(*render, chat.DERENDER_PATH, {
                "stream": True, "model": rendered["model"], "generate_chunk": item, "stream_state": state,
                "prompt_tokens": len(rendered["token_ids"]), "prompt_token_ids": rendered["token_ids"],
                "chat_request": request_of(finishing)}, 120)
            assert status == 200, raw[:500]
            state = answer["stream_state"]
            for choice in answer["chunk"]["choices"]:
                for call in choice["delta"].get("tool_calls") or []:
                    call.pop("id", None)  # drawn anew per request: its stability is checked above
            out.append(answer["chunk"]["choices"])
        return out

    with_context = derendered(framing.chat_request)
    assert with_context == derendered(lambda _finishing: TOOL_TURN)
    assert any(c and c[0]["delta"].get("tool_calls") for c in with_context)
    with FakeInferenceServer(SETTINGS) as replica:
        plain, _ = assembled(run([render], TOOL_TURN, [replica.url]).data)
        junk, _ = assembled(run([render], dict(TOOL_TURN, junk="x" * (2 << 20)), [replica.url]).data)
    assert junk == plain
