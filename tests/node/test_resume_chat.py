"""The resuming layer's requests (kimi_cluster/node/resume/chat.py, messages.py) without a render server: what is
not resumed and why, a request that is not streamed sent whole to the twin when its replica is lost, and the
Anthropic events made from chat chunks."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest

from kimi_cluster.fakes.inference.server import FakeInferenceServer
from kimi_cluster.fakes.inference.settings import DEFAULT_MODEL, FakeSettings
from kimi_cluster.node.resume import chat, messages
from kimi_cluster.node.resume.generation import Limits
from kimi_cluster.node.resume.pool import Pool
from kimi_cluster.node.resume.render import RenderServers
from tests.node.resume_stand_ins import CutProxy

QUICK = Limits(silence_s=0.3, tick_s=0.05, pick_s=5.0, resumes=3, connect_s=2.0)


@pytest.mark.parametrize(("body", "why"), [
    ({"n": 2}, "n > 1"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}}, "guided decoding"),
    ({"response_format": {"type": "json_object"}}, "guided decoding"),
    ({"structured_outputs": {"regex": "[a-z]+"}}, "guided decoding (structured_outputs)"),
    ({"tool_choice": "required"}, "forced tool_choice"),
    ({"tool_choice": {"type": "function", "function": {"name": "get_weather"}}}, "forced tool_choice"),
    ({"stop": ["\n\n"]}, "stop strings"),
])
def test_what_cannot_be_resumed_exactly_says_why(body: dict, why: str) -> None:
    assert why in (chat.not_resumable({"stream": True, **body}) or "")


def test_a_plain_stream_with_tools_offered_is_resumable() -> None:
    assert chat.not_resumable({"stream": True, "tools": [{"type": "function"}], "tool_choice": "auto",
                               "response_format": {"type": "text"}, "n": 1}) is None
    rendered = {"token_ids": [1], "sampling_params": {"max_tokens": 10, "structured_outputs": None, "n": 1}}
    assert chat.not_resumable_rendered(rendered) is None
    strict = {"token_ids": [1], "sampling_params": {"max_tokens": 10, "structured_outputs": {"structural_tag": "x"}}}
    assert "guided decoding" in (chat.not_resumable_rendered(strict) or "")
    assert chat.not_resumable_messages({"tool_choice": {"type": "any"}}) == "a forced tool_choice (guided decoding)"
    assert chat.not_resumable_messages({"tool_choice": {"type": "auto"}}) is None


class Recorder:
    """chat.Client that keeps what it was given."""

    def __init__(self) -> None:
        self.answers: list[tuple[int, bytes]] = []
        self.stream: list[bytes] = []
        self.lock = threading.Lock()

    def whole(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        with self.lock:
            self.answers.append((status, body))

    def start_stream(self) -> None:
        self.answers.append((200, b"<stream>"))

    def write(self, data: bytes) -> None:
        self.stream.append(data)

    def end(self) -> None:
        self.stream.append(b"<end>")


@pytest.mark.integration
@pytest.mark.parametrize("mode", ["reset", "silence"])
def test_a_request_not_streamed_goes_whole_to_the_twin_and_is_answered_once(mode: str) -> None:
    settings = FakeSettings(engine="vllm", token_seconds=0.002, scale_out=True)
    with FakeInferenceServer(settings) as lost, FakeInferenceServer(settings) as twin:
        proxy = CutProxy(lost.url, cut_after=0, mode=mode)
        pool = Pool([proxy.url, twin.url], interval_s=0.05, timeout_s=0.1, fails=1, passes=2)
        pool.start()
        client = Recorder()
        body = {"model": DEFAULT_MODEL, "messages": [{"role": "user", "content": "What is the capital of France?"}]}
        try:
            front = chat.Front(pool, RenderServers([("127.0.0.1", 9)]), QUICK)
            chat.handle(front, chat.CHAT_PATH, json.dumps(body).encode(), client)
        finally:
            pool.stop.set()
            proxy.close()
    assert len(client.answers) == 1 and client.answers[0][0] == 200
    assert "Paris" in json.loads(client.answers[0][1])["choices"][0]["message"]["content"]
    assert proxy.lost.is_set()


def chunk(delta: dict[str, Any] | None = None, finish: str | None = None, usage: dict | None = None) -> dict:
    if usage is not None:
        return {"id": "x", "choices": [], "usage": usage}
    return {"id": "x", "choices": [{"index": 0, "delta": delta or {}, "finish_reason": finish}]}


def test_anthropic_events_follow_vllms_converter_for_thinking_text_and_a_tool_call() -> None:
    events = messages.MessageEvents("moonshotai/Kimi-K3.1-Pro")
    frames = []
    for c in (chunk({"role": "assistant", "reasoning": "I will "}), chunk({"reasoning": "call it."}),
              chunk({"content": "Checking."}),
              chunk({"tool_calls": [{"index": 0, "id": "functions.get_weather:0", "type": "function",
                                     "function": {"name": "get_weather", "arguments": ""}}]}),
              chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"city": '}}]}),
              chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"Tokyo"}'}}]}, "tool_calls"),
              chunk(usage={"prompt_tokens": 40, "completion_tokens": 12, "total_tokens": 52})):
        frames += events.feed(c)
    parsed = [(f.split(b"\n")[0].decode()[7:], json.loads(f.split(b"\n")[1][6:])) for f in frames]
    names = [name for name, _ in parsed]
    assert names == ["message_start", "content_block_start", "content_block_delta", "content_block_delta",
                     "content_block_delta", "content_block_stop", "content_block_start", "content_block_delta",
                     "content_block_stop", "content_block_start", "content_block_delta", "content_block_delta",
                     "content_block_stop", "message_delta", "message_stop"]
    assert parsed[4][1]["delta"]["type"] == "signature_delta"  # the thinking block is signed as it closes
    assert parsed[9][1]["content_block"] == {"type": "tool_use", "id": "functions.get_weather:0",
                                             "name": "get_weather", "input": {}}
    assert "".join(d["delta"]["partial_json"] for n, d in parsed if d.get("delta", {}).get("type")
                   == "input_json_delta") == '{"city": "Tokyo"}'
    assert parsed[13][1]["delta"]["stop_reason"] == "tool_use"
    assert parsed[13][1]["usage"] == {"input_tokens": 40, "output_tokens": 12}


def test_the_derender_request_of_a_messages_stream_counts_earlier_tool_calls() -> None:
    rendered = {"model": "m", "parse_context": {"tools": None, "tool_choice": "none", "include_reasoning": True,
                                                "chat_template_kwargs": {}, "history_tool_call_cnt": 3}}
    request = messages.chat_request(rendered)
    assert len(request["messages"][0]["tool_calls"]) == 3 and "history_tool_call_cnt" not in request
    assert messages.chat_request({"model": "m", "parse_context": {}})["messages"] == []
