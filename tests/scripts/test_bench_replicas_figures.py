"""benchmarks.bench_replicas' own figures from the streams it saw: which streams count as open at the loss, how long
each one's client waited for a chunk from the loss on (`longest_resume_gap_s`), and which completed streams differ
from the first of their kind; what it reads from the front's log."""

from __future__ import annotations


def test_a_stream_open_at_the_loss_counts_its_longest_wait_for_a_chunk_from_the_loss_on():
    from benchmarks.bench_replicas import Tally  # imports the openai SDK: only here

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
    from benchmarks.bench_replicas import Tally

    tally = Tally()
    tally.check("tool-call stream", ("", "thinking", "tool_calls", [("get_weather", '{"city": "Tokyo"}', 1)]),
                [1.0], started=0.5)
    tally.check("tool-call stream", ("", "thinking", "tool_calls", [("get_weather", '{"city": "Tok"}', 1)]),
                [2.0], started=1.5)
    tally.check("stream", "text", [3.0], started=2.5)  # another kind: its own reference
    assert len(tally.streams_wrong) == 1 and "Tok" in tally.streams_wrong[0]


def test_the_front_log_counts_only_what_was_written_after_its_size_was_taken(tmp_path):
    from benchmarks.bench_replicas import resume_log_lines, resume_log_sizes

    log = tmp_path / "10.0.0.9/var/log/kimi-cluster/resume.log"
    log.parent.mkdir(parents=True)
    log.write_text("kimi-resume: a stream not resumed: stop strings\n")
    before = resume_log_sizes(tmp_path)
    with log.open("a") as handle:
        handle.write("kimi-resume: request x: carried on by y\nkimi-resume: a stream not resumed: n > 1\n")
    assert resume_log_lines(before, "a stream not resumed: ") == ["kimi-resume: a stream not resumed: n > 1"]
    assert len(resume_log_lines(resume_log_sizes(tmp_path, empty=True), "a stream not resumed: ")) == 2
    assert resume_log_sizes(tmp_path / "elsewhere") == {}
