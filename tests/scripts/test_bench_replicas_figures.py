"""benchmarks.bench_replicas' own figures from the streams it saw: which streams count as open at the loss, how long
each one's client waited for a chunk from the loss on (`longest_resume_gap_s`), and which completed streams differ
from the first of their kind; what it reads from the front's log, its engines' counters and its layer's memory; and
--noisy's percentiles and side-by-side table."""

from __future__ import annotations


def test_a_stream_open_at_the_loss_counts_its_longest_wait_for_a_chunk_from_the_loss_on():
    from benchmarks._replicas_load import Tally  # imports the openai SDK: only here

    tally = Tally(loss_at=10.0)
    # Open at the loss: a wait of 0.9 s for its first chunk before the loss (not counted), a chunk at 9.95, none
    # until 11.4 (the twin's first: a wait of 1.45 s across the cut), then one at 11.5.
    tally.check("stream", "same", [9.9, 9.95, 11.4, 11.5], started=9.0)
    # Started after the loss, and ended before it: neither was open at the loss.
    tally.check("stream", "same", [12.0, 12.1], started=11.0)
    tally.check("stream", "same", [8.5, 9.0], started=8.0)
    assert [round(g, 3) for g in tally.resume_gaps] == [1.45]
    assert tally.streams_wrong == []


def test_a_stream_that_differs_from_the_first_of_its_kind_is_wrong():
    from benchmarks._replicas_load import Tally

    tally = Tally()
    tally.check("tool-call stream", ("", "thinking", "tool_calls", [("get_weather", '{"city": "Tokyo"}', 1)]),
                [1.0], started=0.5)
    tally.check("tool-call stream", ("", "thinking", "tool_calls", [("get_weather", '{"city": "Tok"}', 1)]),
                [2.0], started=1.5)
    tally.check("stream", "text", [3.0], started=2.5)  # another kind: its own reference
    assert len(tally.streams_wrong) == 1 and "Tok" in tally.streams_wrong[0]


def test_the_front_log_counts_only_what_was_written_after_its_size_was_taken(tmp_path):
    from benchmarks._replicas_front import resume_log_lines, resume_log_sizes

    log = tmp_path / "10.0.0.9/var/log/kimi-cluster/resume.log"
    log.parent.mkdir(parents=True)
    log.write_text("kimi-resume: a stream not resumed: stop strings\n")
    before = resume_log_sizes(tmp_path)
    with log.open("a") as handle:
        handle.write("kimi-resume: request x: carried on by y\nkimi-resume: a stream not resumed: n > 1\n")
    assert resume_log_lines(before, "a stream not resumed: ") == ["kimi-resume: a stream not resumed: n > 1"]
    assert len(resume_log_lines(resume_log_sizes(tmp_path, empty=True), "a stream not resumed: ")) == 2
    assert resume_log_sizes(tmp_path / "elsewhere") == {}


def test_percentiles_lie_linearly_between_the_nearest_values_as_numpys_do():
    from benchmarks._replicas_noisy import percentile

    values = [4.0, 1.0, 3.0, 2.0, 5.0]
    assert percentile(values, 50) == 3.0
    assert round(percentile(values, 95) or 0, 6) == 4.8  # numpy.percentile([1..5], 95): 4.8
    assert percentile([], 50) is None and percentile([7.0], 95) == 7.0


def test_the_layers_log_counts_what_it_sent_again_and_what_took_a_replica_out():
    from benchmarks._replicas_noisy import log_counts

    lines = [
        "kimi-resume: replica http://10.0.0.5:8000 is down: HTTP 500",
        "kimi-resume: replica http://10.0.0.6:8000 is down: 2 health checks missed in a row",
        "kimi-resume: request r1: lost http://10.0.0.5:8000 after 12 tokens (HTTP 500); carrying on elsewhere",
        "kimi-resume: request r1: carried on by http://10.0.0.6:8000 0.40 s after the loss",
        "kimi-resume: a request that is not streamed lost http://10.0.0.5:8000 (reset); sending it whole to another "
        "replica",
        "kimi-resume: replica http://10.0.0.5:8000 is back: 2 good health checks in a row",
    ]
    assert log_counts(lines) == {"sent_again": 2, "marked_down_by_a_request": 1, "marked_down_by_health_checks": 1}


def test_the_engines_counter_is_summed_over_its_labels_and_missing_is_none():
    from benchmarks._replicas_front import REQUESTS_COUNTER, counter

    text = (f"# TYPE {REQUESTS_COUNTER} counter\n{REQUESTS_COUNTER}{{model_name=\"kimi\"}} 12.0\n"
            f"{REQUESTS_COUNTER}{{model_name=\"other\"}} 3.0\nvllm:prompt_tokens_total{{model_name=\"kimi\"}} 99.0\n")
    assert counter(text, REQUESTS_COUNTER) == 15
    assert counter("error: connection refused", REQUESTS_COUNTER) is None


def test_the_layers_memory_is_read_from_its_proc_status():
    from benchmarks._replicas_front import memory_kib

    status = "Name:\tpython3\nVmPeak:\t  300000 kB\nVmHWM:\t   51200 kB\nVmRSS:\t   40960 kB\nThreads:\t9\n"
    assert memory_kib(status) == {"VmHWM": 51200, "VmRSS": 40960}
    assert memory_kib("Name:\tzombie\n") == {}


def _phase(noisy, whole, cut=0, sent_again=0, begun=10, peak=51200, answers=None):
    from benchmarks._replicas_load import FIRST_CHUNK, STREAM, WHOLE

    return {"noisy": noisy, "requests": 6, "streams_started": 4, "streams_completed": 4 - cut, "streams_cut": cut,
            "cut": ["after 3 chunks: APIError: lost"] * cut, "streams_refused": 0, "refused": [], "streams_hung": 0,
            "streams_wrong": 0, "failed_non_streamed": 0, "failures": [], "sent_by_clients": 10 + noisy,
            "engine_requests_begun": begun, "sent_again": sent_again, "marked_down_by_a_request": 3 * noisy,
            "marked_down_by_health_checks": 0, "layer_pid": 7, "layer_pid_after": 7, "layer_peak_reset": True,
            "layer_peak_kib": peak, "layer_rss_kib": peak - 1024, "five_hundreds_answers": answers or {},
            "latencies": {WHOLE: whole, FIRST_CHUNK: [0.1, 0.2], STREAM: [1.0, 1.2]}}


def test_the_phases_of_each_kind_are_summed_and_set_side_by_side():
    from benchmarks._replicas_load import WHOLE
    from benchmarks._replicas_noisy import format_noisy, summed

    quiet = summed([_phase(False, [1.0, 1.0]), _phase(False, [1.0, 1.0])])
    noisy = summed([_phase(True, [1.0, 3.0], cut=1, sent_again=2, begun=13, peak=102400, answers={"503": 4}),
                    _phase(True, [1.0, 1.0], answers={"500": 2, "503": 1})])
    assert quiet["requests"] == 12 and quiet[WHOLE] == {"count": 4, "p50_s": 1.0, "p95_s": 1.0}
    assert noisy["streams_cut"] == 1 and noisy["sent_again"] == 2 and noisy["layer_peak_kib"] == 102400
    assert noisy["five_hundreds_answers"] == {"500": 2, "503": 5} and noisy[WHOLE]["p95_s"] == 2.7
    text = format_noisy({"chats": 8, "token_seconds": 0.02, "phase_seconds": 20.0, "rounds": 2,
                         "noisy_interval_s": 0.25, "unfetchable_image": "http://127.0.0.1:9/kimi.png",
                         "quiet": quiet, "noisy": noisy})
    row = next(line for line in text.splitlines() if line.startswith(f"{WHOLE} p50"))
    assert "1.00 / 2.70" in row  # the noisy phases' p95 is 2.7 times the quiet ones'
    arrivals = next(line for line in text.splitlines() if line.startswith("engine arrivals"))
    assert arrivals.split()[-2:] == ["+0", "+1"]  # 20 begun of 20 sent; 23 begun of 22 sent
    assert "500 x 2, 503 x 5" in text and "100.0 / 99.0" in text and "how each figure is taken" in text


def test_a_streamed_tool_turns_budget_is_the_fakes_whole_tool_turn_up_to_eos():
    """The fake's token door, given the bench's tool prompt as the chat layer renders it, generates exactly the
    budget the bench streams tool turns with, its tools section inside it and EOS its last token."""
    from benchmarks._replicas_load import TOOL_TASK, tool_turn_tokens
    from kimi_cluster.checks.tools import TOOLS
    from kimi_cluster.fakes import tiny_model
    from kimi_cluster.fakes.inference import generate
    from kimi_cluster.fakes.inference.settings import FakeSettings

    prompt = tiny_model.encode(tiny_model.render([{"role": "user", "content": TOOL_TASK}], TOOLS, None))
    turn, done = generate.continuation(prompt, FakeSettings())
    assert done == 0 and len(turn) == tool_turn_tokens() and turn[-1] == tiny_model.EOS_ID
    assert "<|open|>call tool=" in tiny_model.decode(turn)


def test_the_refusal_the_bench_counts_apart_is_the_one_sglangs_chat_layer_sends():
    from pathlib import Path

    from benchmarks._replicas_load import CUT_IN_MARKER, CUT_IN_TOOLS
    from kimi_cluster.node import sglang_chat

    source = Path(sglang_chat.__file__).read_text()
    assert CUT_IN_TOOLS in source and CUT_IN_MARKER in source


class _Client:
    """Stands in for openai.OpenAI: `create` streams the given chunks, then raises `error` if one is given."""

    def __init__(self, chunks, error=None):
        self.chunks, self.error = chunks, error
        self.chat = self
        self.completions = self

    def create(self, **_body):
        yield from self.chunks
        if self.error is not None:
            raise self.error


def _client(chunks, error=None):
    """A _Client, typed as the SDK's client _stream takes (it uses its `chat.completions.create` only)."""
    from typing import cast

    import openai

    return cast(openai.OpenAI, _Client(chunks, error))


def _chunk(reasoning="", call=None, finish=None):
    from openai.types.chat import ChatCompletionChunk

    delta = {"role": "assistant", "reasoning": reasoning}
    if call is not None:
        delta["tool_calls"] = [{"index": 0, "id": "get_weather:0", "function": {"name": call, "arguments": "{}"}}]
    return ChatCompletionChunk.model_validate({
        "id": "c", "object": "chat.completion.chunk", "created": 0, "model": "kimi",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})


def _error_event(message):
    import httpx2
    import openai

    return openai.APIError(message, httpx2.Request("POST", "https://front/v1/chat/completions"), body=None)


def test_streamed_tool_calls_and_refusals_by_design_are_counted_apart_from_cuts():
    from benchmarks._replicas_load import Tally, _stream

    tally = Tally()
    whole = [_chunk("thinking"), _chunk(call="get_weather"), _chunk(finish="tool_calls")]
    _stream(_client(whole), "kimi", tally, tools=441)
    _stream(_client([_chunk("thinking"), _chunk(finish="length")]), "kimi", tally, tools=441)  # no call reached
    refusal = ("the replica serving this stream was lost after 380 tokens, and the stream cannot be resumed exactly: "
               "the cut fell inside the tools section, and SGLang restarts the tool turn's structural tag at a "
               "resumed request's first token")
    _stream(_client(whole[:2], _error_event(refusal)), "kimi", tally, tools=441)
    _stream(_client(whole[:1], _error_event("the replica serving this stream was lost (reset)")), "kimi", tally,
            tools=441)
    marker = ("the replica serving this stream was lost after 330 tokens, and the stream cannot be resumed exactly: "
              "the cut fell part way into '<|close|>tools<|sep|>', which the twin would not see whole")
    _stream(_client(whole[:1], _error_event(marker)), "kimi", tally, tools=441)
    assert (tally.tool_streams_started, tally.tool_streams_called, tally.streams_done) == (5, 1, 2)
    assert len(tally.refused_in_tools) == 1 and "structural tag" in tally.refused_in_tools[0]
    assert len(tally.refused_in_marker) == 1 and "would not see whole" in tally.refused_in_marker[0]
    assert len(tally.streams_cut) == 1 and "reset" in tally.streams_cut[0]
    # The stream that stopped by length before its call differs from the first of its kind: that is wrong.
    assert len(tally.streams_wrong) == 1
