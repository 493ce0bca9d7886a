"""The load bench_replicas runs through the front: `--chats` workers on the official `openai` client (TLS with the
stack's CA, the stack's key, the client's own retries off: what the front delivers is what is counted). Half make
tool-call round trips (a non-streamed request that calls a tool, the tool's result sent back, the final answer),
half stream; what they saw goes into one `Tally`, each answer's latency with it."""

from __future__ import annotations

import argparse
import itertools
import json
import ssl
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import openai

from kimi_cluster.checks.tools import TOOL_IMPLS, TOOLS

TOOL_TASK = "What is the weather in Tokyo? Use the tool."
# How the front's resuming layer says it refused to carry a stream on because the cut fell inside its tools section
# (kimi_cluster/node/sglang_chat.py, `resume`): SGLang 0.5.23 restarts a tool turn's structural tag at a resumed
# request's first token, so such a stream ends with an error event naming this, by design.
CUT_IN_TOOLS = "the cut fell inside the tools section"
# And because the cut fell part way into a stop string, the end of reasoning or the tools opening, which the twin
# would not see whole (the same `resume`): refused by design too, and counted apart as well.
CUT_IN_MARKER = "the cut fell part way into"


def tool_turn_tokens() -> int:
    """The fake engines' whole tool turn for TOOL_TASK in tokens (reasoning at the template's default effort, the
    tools section, EOS), as both token doors generate it (kimi_cluster/fakes/inference/generate.py): the budget a
    streamed tool turn needs to reach its call and finish with `tool_calls`."""
    from kimi_cluster.fakes import tiny_model
    from kimi_cluster.fakes.inference.compose import compose_reply
    from kimi_cluster.fakes.inference.generate import xtml
    from kimi_cluster.fakes.inference.settings import DEFAULT_EFFORT, FakeSettings

    names = [tool["function"]["name"] for tool in TOOLS if "function" in tool]
    reply = compose_reply([{"role": "user", "content": TOOL_TASK}], names, DEFAULT_EFFORT, FakeSettings())
    return len(tiny_model.encode(xtml(reply)))


@dataclass
class Tally:
    """What the workers saw, under one lock."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    requests: int = 0
    failed: list[str] = field(default_factory=list)
    streams_started: int = 0
    streams_done: int = 0
    streams_cut: list[str] = field(default_factory=list)
    stream_refused: list[str] = field(default_factory=list)
    trips_started: int = 0
    trips_done: int = 0
    # Streamed tool turns: started, and those that finished with `tool_calls` and a named call (the non-streamed
    # round trips are counted apart, in trips_*).
    tool_streams_started: int = 0
    tool_streams_called: int = 0
    # Streams the resuming layer refused to carry on because their cut fell inside the tools section (CUT_IN_TOOLS):
    # neither cut by a fault nor wrong, and not counted in streams_cut.
    refused_in_tools: list[str] = field(default_factory=list)
    refused_in_marker: list[str] = field(default_factory=list)  # likewise, for CUT_IN_MARKER
    open_streams: int = 0
    streams_wrong: list[str] = field(default_factory=list)
    # The first completed stream of each kind, which every later one must equal (the fake engines answer a prompt
    # the same way every time): a stream carried on on the twin must come out whole, no token twice or lost.
    reference: dict[str, Any] = field(default_factory=dict)
    loss_at: float | None = None  # when the replica was lost (time.monotonic)
    # For each completed stream that was open at the loss: the longest its client waited for a chunk from the loss
    # on, the wait across the cut included (from its last chunk before the loss), in seconds. Keep-alive comments
    # are not chunks: the SDK skips them. The replica goes some milliseconds after `loss_at` (the reclaim's own
    # time), so the wait is measured between chunks, never from `loss_at`, which would leave that time out.
    resume_gaps: list[float] = field(default_factory=list)
    # Seconds each answer took, by kind (WHOLE, FIRST_CHUNK, STREAM): those that came whole only.
    latencies: dict[str, list[float]] = field(default_factory=dict)
    # When each failure, cut or refusal was noted (time.monotonic): a burst of fast failures is one event.
    noted_at: list[float] = field(default_factory=list)

    def add(self, **counts: int) -> None:
        with self.lock:
            for key, n in counts.items():
                setattr(self, key, getattr(self, key) + n)

    def note(self, which: str, text: str) -> None:
        with self.lock:
            getattr(self, which).append(text)
            self.noted_at.append(time.monotonic())

    def check(self, kind: str, got: Any, times: list[float], started: float) -> None:
        """A completed stream: as the first of its kind, and its longest chunk gap if it was open at the loss."""
        with self.lock:
            expected = self.reference.setdefault(kind, got)
            if got != expected:
                self.streams_wrong.append(f"{kind}: {str(got)[:200]} instead of {str(expected)[:200]}")
            if self.loss_at is not None and started < self.loss_at < times[-1]:
                stamps = [started, *times]
                self.resume_gaps.append(max(b - a for a, b in itertools.pairwise(stamps) if b > self.loss_at))

    def timed(self, kind: str, seconds: float) -> None:
        """One answer's latency, as its client saw it."""
        with self.lock:
            self.latencies.setdefault(kind, []).append(seconds)


# The latencies Tally keeps: a non-streamed request from its send to its whole answer; a stream from its send to its
# first chunk, and to its last.
WHOLE, FIRST_CHUNK, STREAM = "non-streamed request", "stream's first chunk", "whole stream"


def client_for(base_url: str, key: str, ca_file: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=60,
                         http_client=openai.DefaultHttpxClient(verify=ssl.create_default_context(cafile=ca_file)))


def _round_trip(client: openai.OpenAI, model: str, tally: Tally) -> None:
    """One tool-call round trip: ask, run the tool the model calls, send its result, read the answer."""
    tally.add(trips_started=1)
    messages: list[Any] = [{"role": "user", "content": TOOL_TASK}]
    for _ in range(4):
        tally.add(requests=1)
        sent = time.monotonic()
        try:
            reply = client.chat.completions.create(model=model, messages=messages, tools=TOOLS,
                                                   max_tokens=256)
        except openai.OpenAIError as exc:
            tally.note("failed", f"{type(exc).__name__}: {str(exc)[:160]}")
            return
        tally.timed(WHOLE, time.monotonic() - sent)
        message = reply.choices[0].message
        if not message.tool_calls:
            tally.add(trips_done=1)
            return
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls:
            function = getattr(call, "function", None)  # a custom tool call has none
            name = getattr(function, "name", "")
            args = json.loads(function.arguments) if function is not None and name in TOOL_IMPLS else {}
            result = TOOL_IMPLS[name](**args) if name in TOOL_IMPLS else {"error": "unknown tool"}
            messages.append({"role": "tool", "tool_call_id": call.id, "content": json.dumps(result)})
    tally.note("failed", "tool round trip: still calling tools after 4 turns")


def _stream(client: openai.OpenAI, model: str, tally: Tally, tools: int | None) -> None:
    """One streamed turn, assembled: plain text, or (with `tools`, its budget in tokens) reasoning and a tool call,
    each tool call's id the same in every chunk that names one."""
    chunks, times, started = 0, [], time.monotonic()
    text: dict[str, str] = {"content": "", "reasoning": ""}
    calls: dict[int, dict[str, Any]] = {}
    finish = None
    tally.add(streams_started=1, open_streams=1, tool_streams_started=1 if tools else 0)
    try:
        stream = client.chat.completions.create(
            model=model, stream=True, max_tokens=tools or 256,
            messages=[{"role": "user", "content": TOOL_TASK if tools else "Tell me about Kimi."}],
            tools=TOOLS if tools else openai.omit)
        for chunk in stream:
            chunks += 1
            times.append(time.monotonic())
            for choice in chunk.choices:
                delta = choice.delta
                text["content"] += delta.content or ""
                text["reasoning"] += (delta.model_extra or {}).get("reasoning") or ""
                for call in delta.tool_calls or []:
                    slot = calls.setdefault(call.index, {"ids": set(), "name": "", "arguments": ""})
                    slot["ids"] |= {call.id} if call.id else set()
                    if call.function is not None:
                        slot["name"] += call.function.name or ""
                        slot["arguments"] += call.function.arguments or ""
                finish = choice.finish_reason or finish
        tally.add(streams_done=1)
        if times:
            tally.timed(FIRST_CHUNK, times[0] - started)
            tally.timed(STREAM, times[-1] - started)
        got = (text["content"], text["reasoning"], finish,
               [(c["name"], c["arguments"], len(c["ids"])) for _, c in sorted(calls.items())])
        tally.check("tool-call stream" if tools else "stream", got, times or [started], started)
        if tools and finish == "tool_calls" and any(c["name"] for c in calls.values()):
            tally.add(tool_streams_called=1)
    except openai.OpenAIError as exc:
        # Before the first chunk the front could still have sent it elsewhere: that one is a refused request.
        which = "streams_cut" if chunks else "stream_refused"
        if chunks and CUT_IN_TOOLS in str(exc):
            which = "refused_in_tools"
        elif chunks and CUT_IN_MARKER in str(exc):
            which = "refused_in_marker"
        # The layer's reason comes last in its message: a refusal by design keeps it.
        shown = str(exc)[:160] if which in ("streams_cut", "stream_refused") else str(exc)[:320]
        tally.note(which, f"after {chunks} chunks: {type(exc).__name__}: {shown}")
    finally:
        tally.add(open_streams=-1)


def run_load(base_url: str, key: str, ca_file: str, model: str, chats: int, stop: threading.Event,
             tally: Tally) -> list[threading.Thread]:
    tool_budget = tool_turn_tokens()

    def worker(index: int) -> None:
        client = client_for(base_url, key, ca_file)
        while not stop.is_set():
            if index % 2 == 0:
                _round_trip(client, model, tally)
            else:  # every other stream worker streams a tool call with its reasoning
                _stream(client, model, tally, tools=tool_budget if index % 4 == 3 else None)

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(chats)]
    for t in threads:
        t.start()
    return threads



def start_load(outputs: dict[str, Any], args: argparse.Namespace,
               ) -> tuple[str, Tally, threading.Event, list[threading.Thread]]:
    """The load both measurements run under: `--chats` workers through the front, trusting the stack's CA (written
    to a file the caller removes), running for `--before` seconds before this returns. Returns the CA file's path,
    the tally, the event that stops the workers, and their threads."""
    ca = write_ca(outputs)
    tally, stop = Tally(), threading.Event()
    threads = run_load(outputs["openai_base_url"], outputs["api_key"], ca, outputs["served_model_name"],
                       args.chats, stop, tally)
    time.sleep(args.before)
    return ca, tally, stop, threads


def write_ca(outputs: dict[str, Any]) -> str:
    """The stack's CA in a file of its own (the caller removes it)."""
    with tempfile.NamedTemporaryFile("w", suffix=".pem", delete=False) as ca:
        ca.write(outputs["ca_certificate"])
    return ca.name
