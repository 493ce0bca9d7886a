"""The front's resuming layer over SGLang's real chat layer: SGLang 0.5.23's chat route on this CPU
(kimi_cluster/node/sglang_chat.py, in the parsers' venv), the fake engine's SGLang `/generate` as two replicas, and
kimi_cluster/node/resume between them.

A streamed reasoning turn and a tool-call turn are cut after every one of their tokens, by a reset, and each cut
stream, assembled by the official `openai` SDK's accumulator, is the uncut one (reasoning, content, the tool call's
name, arguments, index and id, the finish reason, and the usage: the original prompt and every token), wherever
SGLang's grammar facts allow a cut to carry on; a tool turn cut inside its tools section (SGLang restarts the turn's
structural tag at a resumed request's first token) ends with an error event that says so. Every request the twins
receive, and every answer the fake streams, passes SGLang's own contract models (`GenerateRequest`,
`GenerateResponse`).
"""

from __future__ import annotations

import json
import re
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from kimi_cluster.checks.tools import TOOLS
from kimi_cluster.fakes import tiny_model
from kimi_cluster.fakes.inference import sglang_door
from kimi_cluster.fakes.inference.server import FakeInferenceServer
from kimi_cluster.fakes.inference.settings import DEFAULT_MODEL, FakeSettings
from kimi_cluster.node.resume import wire
from kimi_cluster.node.resume.generation import Limits
from tests.engine_parsers.render_server import VENV, require_sglang, sglang_chat_server
from tests.node.resume_fixtures import (
    QUICK_TO_NOTICE,
    Recorder,
    Served,
    assembled,
    error_of,
    layer_over,
    through_layer,
)
from tests.node.resume_stand_ins import CutProxy

# A cut after every token of two turns: some 4 minutes on 2 loaded cores.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

require_sglang()

# The cuts here are resets: a silence bound as short as a loaded machine's pauses would add losses of its own (and,
# inside a tools section, refusals), so silence is not what ends a stream in these tests.
QUICK = Limits(silence_s=60.0, tick_s=0.05, pick_s=10.0, resumes=3, connect_s=2.0)
USER: list[ChatCompletionMessageParam] = [{"role": "user", "content": "What is the weather in Oslo? Use the tool."}]
TOOL_TURN = {"model": DEFAULT_MODEL, "stream": True, "max_tokens": 1000, "tools": TOOLS, "reasoning_effort": "low",
             "stream_options": {"include_usage": True}, "messages": USER}
# No tools: no grammar, so every cut carries on.
REASONING_TURN = {"model": DEFAULT_MODEL, "stream": True, "max_tokens": 1000, "reasoning_effort": "low",
                  "stream_options": {"include_usage": True},
                  "messages": [{"role": "user", "content": "Say hello."}]}
SETTINGS = FakeSettings(engine="sglang", token_seconds=0.001)
TOOLS_OPEN, THINK_CLOSE = "<|open|>tools<|sep|>", "<|close|>think<|sep|>"


@pytest.fixture(scope="module")
def chat_layer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    with sglang_chat_server(tmp_path_factory.mktemp("sglang-chat")) as url:
        yield wire.address(url)


def run(layer: tuple[str, int], body: dict[str, Any], replicas: list[str]) -> Recorder:
    return through_layer([layer], body, replicas, QUICK, engine="sglang")


_VALIDATE = """
import json, sys
from sglang.api.v1 import api_types
from sglang.srt.entrypoints.api_contract import generate_contract_error
for line in sys.stdin:
    name, payload = json.loads(line)
    try:
        if name == "contract_error":
            print(json.dumps(generate_contract_error(payload)))
            continue
        getattr(api_types, name).from_json_value(payload)
    except Exception as exc:
        print(name, type(exc).__name__, str(exc).splitlines()[0], json.dumps(payload)[:300])
"""


def sglang_says(items: list[tuple[str, Any]]) -> str:
    """What SGLang's own contract models say of (model name, payload) pairs: '' when all pass."""
    lines = "\n".join(json.dumps(item) for item in items)
    done = subprocess.run([str(VENV / "bin" / "python"), "-c", _VALIDATE], input=lines, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_the_fake_serves_generate_and_tokenize_in_sglangs_shape() -> None:
    with FakeInferenceServer(SETTINGS) as replica:
        prompt = tiny_model.encode(tiny_model.render(USER))
        tokenized = _post(replica.url + "/v1/tokenize", {"model": DEFAULT_MODEL, "messages": USER})
        assert tokenized == {"tokens": prompt, "count": len(prompt), "max_model_len": SETTINGS.max_model_len}
        refused = _post(replica.url + "/v1/tokenize", {"messages": USER, "add_generation_prompt": True})
        assert "add_generation_prompt" in refused["message"]
        unknown = {"input_ids": prompt, "sampling_params": {"max_tokens": 5}}
        answer = _post(replica.url + "/generate", unknown)
        whole = _post(replica.url + "/generate", {"input_ids": prompt, "sampling_params": {"max_new_tokens": 7}})
    body = {"rid": "r1", "input_ids": prompt, "stream": True, "sampling_params": {"max_new_tokens": 40, "stop": ["x"]}}
    cumulative = list(sglang_door.stream_events(body, SETTINGS))
    incremental = list(sglang_door.stream_events(body, FakeSettings(engine="sglang",
                                                                    incremental_streaming_output=True)))
    # SGLang's own contract: the same 400 text for the unknown sampling key, and every body and answer taken.
    said = sglang_says([("contract_error", unknown), ("GenerateRequest", body), ("GenerateResponse", whole)]
                       + [("GenerateResponse", e) for e in cumulative + incremental]).splitlines()
    assert said[0] == json.dumps(answer["error"]) and said[1:] == [], said
    assert whole["meta_info"]["finish_reason"] == {"type": "length", "length": 7} and len(whole["output_ids"]) == 7
    assert cumulative[-1]["output_ids"] == [i for e in incremental for i in e["output_ids"]]
    assert cumulative[-1]["text"] == "".join(e["text"] for e in incremental)


def _post(url: str, payload: dict[str, Any]) -> Any:
    request = urllib.request.Request(url, json.dumps(payload).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        return json.loads(exc.read())


def cuts(layer: tuple[str, int], body: dict[str, Any]) -> tuple[dict[str, Any], list[int], dict[int, str]]:
    """The uncut answer, its output tokens, and what went wrong at each cut position: '' where the cut stream is
    the uncut one, the error event's message where the stream was refused resume, a description otherwise."""
    with FakeInferenceServer(SETTINGS) as lost, FakeInferenceServer(SETTINGS) as twin:
        first = CutProxy(twin.url, cut_after=None)
        try:
            uncut, uncut_ids = assembled(run(layer, body, [first.url]).data)
        finally:
            first.close()
        output, _, _, _ = sglang_door.generated(first.requests[0], SETTINGS)
        total = uncut["usage"]["completion_tokens"]
        assert total == len(output)

        def cut_at(position: int) -> str:
            proxy, recorder = CutProxy(lost.url, cut_after=position), CutProxy(twin.url, cut_after=None)
            try:
                got = run(layer, body, [proxy.url, recorder.url]).data
            finally:
                proxy.close()
                recorder.close()
            if not proxy.lost.is_set():
                return f"never cut at {position}"
            carried.extend(recorder.requests)
            refused = error_of(got)
            if refused is not None:
                return "refused: " + refused
            # A reset drops what was in flight: the layer may have taken fewer tokens than the proxy relayed.
            delivered = len(recorder.requests[-1]["input_ids"]) - len(proxy.requests[-1]["input_ids"])
            answer, ids = assembled(got)
            return f"{answer} with ids {ids}, not {uncut}" if answer != uncut or ids != uncut_ids else \
                f"resumed after {delivered} tokens"

        carried: list[dict[str, Any]] = []
        with ThreadPoolExecutor(3) as pool:
            wrong = dict(zip(range(total), pool.map(cut_at, range(total)), strict=True))
    # Every request a twin received, resumed or whole, is one SGLang's own contract takes.
    assert carried and sglang_says([("GenerateRequest", r) for r in carried]) == ""
    return uncut, output, wrong


@pytest.mark.long
def test_a_reasoning_stream_cut_after_every_token_is_the_uncut_one(chat_layer: tuple[str, int]) -> None:
    uncut, _, wrong = cuts(chat_layer, REASONING_TURN)
    assert uncut["finish"] == "stop" and uncut["message"]["reasoning_content"] and uncut["message"]["content"]
    assert len(wrong) > 100 and {p: w for p, w in wrong.items() if not w.startswith("resumed after")} == {}


@pytest.mark.long
def test_a_tool_call_stream_carries_on_wherever_sglangs_grammar_allows(chat_layer: tuple[str, int]) -> None:
    uncut, output, wrong = cuts(chat_layer, TOOL_TURN)
    assert uncut["finish"] == "tool_calls" and uncut["message"]["reasoning_content"]
    assert uncut["message"]["tool_calls"][0]["function"]["arguments"] == '{"city": "Oslo"}'
    assert uncut["message"]["tool_calls"][0]["index"] == 0
    text = tiny_model.decode(output)
    opened = len(tiny_model.encode(text[:text.index(TOOLS_OPEN) + len(TOOLS_OPEN)]))  # tokens up to the opening
    at = {p: int(re.search(r"after (\d+) tokens", w).group(1)) for p, w in wrong.items() if "after" in w}
    assert {p: w for p, w in wrong.items() if p not in at} == {}
    resumed = {at[p] for p, w in wrong.items() if w.startswith("resumed")}
    refused = {at[p] for p, w in wrong.items() if w.startswith("refused")}
    # Before the tools section every cut carries on but one part way into the reasoning's end or the tools section's
    # opening (markers of several tokens here: the twin's grammar would not see them whole); from the opening on,
    # every cut is refused.
    def part_way(n: int) -> bool:
        text = tiny_model.decode(output[:n])
        return any(text.endswith(mark[:k]) for mark in (THINK_CLOSE, TOOLS_OPEN) for k in range(1, len(mark)))

    assert len(resumed) > 100 and max(resumed) < opened, (max(resumed), opened)
    assert [n for n in resumed if part_way(n)] == []
    assert [n for n in refused if n < opened and not part_way(n)] == []
    # What a reset loses in flight, more on a loaded machine, moves a late cut back before the opening: the refusal
    # itself is held by the silent cut below, which delivers every token up to its position.
    assert all("tools section" in wrong[p] for p in at if at[p] >= opened)


@pytest.fixture
def front(chat_layer: tuple[str, int]) -> Iterator[Served]:
    with layer_over(chat_layer, SETTINGS, *QUICK_TO_NOTICE) as served:
        yield served


@pytest.fixture
def front_as_deployed(chat_layer: tuple[str, int]) -> Iterator[Served]:
    """The layer with the flags the front gives it: its own defaults (2 s of silence, a health check a second,
    two misses)."""
    with layer_over(chat_layer, SETTINGS) as served:
        yield served


@pytest.mark.parametrize("mode", ["reset", "silence"])
def test_the_openai_client_gets_a_whole_sglang_stream_across_a_loss(front, mode: str) -> None:
    url, proxy, twin = front
    proxy.mode, proxy.cut_after = mode, 60
    client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
    with client.chat.completions.stream(model=DEFAULT_MODEL, max_tokens=1000, tools=TOOLS, messages=USER,
                                        stream_options={"include_usage": True}) as stream:
        for _ in stream:
            pass
        final = stream.get_final_completion()
    assert proxy.lost.is_set()
    choice = final.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.tool_calls and choice.message.tool_calls[0].function.arguments == '{"city": "Oslo"}'
    carried = twin.requests[-1]
    # The twin carried on from the prompt and the 60 tokens delivered, its budget lowered by as many, still
    # reasoning (the cut fell inside the think channel), under a new rid.
    assert carried["sampling_params"]["max_new_tokens"] == 1000 - 60 and carried["require_reasoning"] is True
    assert carried["rid"].endswith("-resume1") or carried["rid"].endswith("-resume0")
    uncut_output, _, _, _ = sglang_door.generated(proxy.requests[-1], SETTINGS)
    assert final.usage is not None and final.usage.completion_tokens == len(uncut_output)
    # The original prompt, as SGLang reports a Kimi K3 prompt: without the three tokens of the assistant's
    # generation stub (serving_chat.py, _reported_prompt_tokens).
    assert final.usage.prompt_tokens == len(proxy.requests[-1]["input_ids"]) - 3
    assert sglang_says([("GenerateRequest", r) for r in proxy.requests + twin.requests]) == ""


def test_a_tool_turn_silent_inside_its_tools_section_ends_with_an_error_that_says_why(chat_layer, front) -> None:
    with FakeInferenceServer(SETTINGS) as replica:  # the body the layer renders, and what the fake makes of it
        recorder = CutProxy(replica.url, cut_after=None)
        try:
            assert error_of(run(chat_layer, TOOL_TURN, [recorder.url]).data) is None
        finally:
            recorder.close()
    output, _, _, _ = sglang_door.generated(recorder.requests[-1], SETTINGS)
    text = tiny_model.decode(output)
    opened = len(tiny_model.encode(text[:text.index(TOOLS_OPEN) + len(TOOLS_OPEN)]))
    url, proxy, _ = front  # its first stream goes to the proxy, first in line
    # Silence, not a reset: every token up to the cut reaches the layer, so the cut is inside the tools section.
    proxy.mode, proxy.cut_after = "silence", opened + 5
    request = urllib.request.Request(url + "/v1/chat/completions", json.dumps(TOOL_TURN).encode(),
                                     {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as answer:
        stream = answer.read()
    refused = error_of(stream)
    assert proxy.lost.is_set() and refused is not None and "tools section" in refused, stream[-600:]


@pytest.mark.parametrize("mode", ["reset", "silence"])
def test_streams_in_flight_at_a_loss_finish_on_the_twin(front_as_deployed, mode: str) -> None:
    """Eight streams at once through the layer's HTTP server with the official client, half of them tool turns and
    half reasoning turns; the first replica loses each stream it carries after its 40th token (inside the
    reasoning), by a reset or by silence. Every stream comes out as the uncut one of its kind, its tool call whole,
    and the longest wait for a chunk is printed beside the issue's bounds (2 s after a reset, 7 s after silence).
    The figures are printed (docs/operations.md quotes them)."""
    url, proxy, twin = front_as_deployed
    proxy.mode, proxy.cut_after = mode, 40
    client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
    kinds: dict[str, dict[str, Any]] = {"tool": {"tools": TOOLS, "messages": USER},
             "reasoning": {"messages": [{"role": "user", "content": "Say hello."}]}}

    def one(kind: str) -> tuple[str, dict[str, Any], float]:
        arrivals: list[float] = []  # chunk by chunk: the wait for the first one (the prompt's prefill) is not a loss's
        with client.chat.completions.stream(model=DEFAULT_MODEL, max_tokens=1000, **kinds[kind]) as stream:
            for _ in stream:
                arrivals.append(time.monotonic())
            final = stream.get_final_completion().model_dump()
        message = final["choices"][0]["message"]
        for call in message.get("tool_calls") or []:
            call.pop("id")
        gaps = [b - a for a, b in zip(arrivals, arrivals[1:], strict=False)]
        return kind, {"message": message, "finish": final["choices"][0]["finish_reason"]}, max(gaps)

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(one, ["tool", "reasoning"] * 4))
    first = {kind: answer for kind, answer, _ in reversed(results)}
    wrong = [kind for kind, answer, _ in results if answer != first[kind]]
    cut = len([r for r in proxy.requests if r.get("stream")])
    carried = len([r for r in twin.requests if "-resume" in str(r.get("rid"))])
    longest = max(gap for _, _, gap in results)
    tools_done = len([a for k, a, _ in results if k == "tool" and a["finish"] == "tool_calls"])
    print(f"\n{mode}: streams {len(results)}, on the lost replica {cut}, carried on {carried}, wrong {len(wrong)}, "
          f"tool calls completed {tools_done}/4, longest wait for a chunk {longest:.2f} s")
    assert proxy.lost.is_set() and cut >= 1 and carried == cut
    assert wrong == [] and tools_done == 4
    assert first["tool"]["message"]["tool_calls"][0]["function"]["arguments"] == '{"city": "Oslo"}'
    # The longest wait is printed, not asserted: a wall time on two shared cores is the machine's. It is measured
    # against the bounds (2 s after a reset, 7 s after silence) by benchmarks/bench_replicas.
