"""Two replicas behind the front in the sandbox: one replica's head reclaimed under load (scripts.bench_replicas),
and no non-streamed request fails, no stream hangs, every tool-call round trip completes, the front stops using the
lost replica at once.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

from scripts import bench_replicas

pytestmark = pytest.mark.timeout(600)


def test_a_reclaimed_replica_costs_no_non_streamed_request(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("FAKE_ENGINE_TOKEN_SECONDS", "0.02")  # restored after; the bench sets it for its nodes
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = bench_replicas.main(["--chats", "8", "--before", "4", "--after", "8", "--json",
                                    "--workdir", str(tmp_path / "sb")])
    assert code == 0
    text = out.getvalue()
    figures = json.loads(text[text.index("{"):])
    print(bench_replicas.format_figures(figures))
    assert figures["requests_before_reclaim"] > 0 and figures["streams_in_flight_at_reclaim"] > 0
    assert figures["failed_non_streamed"] == 0, figures["failures"]
    assert figures["streams_refused_before_first_chunk"] == 0, figures["refused"]
    assert figures["streams_hung"] == 0
    # Only streams under way on the lost replica may be cut, and each ended with an error (counted, not hung).
    assert figures["streams_cut"] <= figures["streams_in_flight_at_reclaim"]
    assert figures["tool_round_trips_completed"] == figures["tool_round_trips_started"] > 0
    assert figures["seconds_until_front_sends_nothing_more"] < 5
    assert figures["front_log_last_try_s"] < 5
    # After the reclaim the load went on through the surviving replica.
    assert figures["requests"] > figures["requests_before_reclaim"]
