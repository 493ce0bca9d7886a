"""Two replicas behind the front in the sandbox: one replica's head reclaimed under load (benchmarks.bench_replicas),
and no non-streamed request fails, no stream is cut or comes out different (those on the lost replica carry on on
the twin), every tool-call round trip completes, the front stops using the lost replica at once.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

# benchmarks.bench_replicas is imported inside the tests: it imports the openai SDK (about 0.8 CPU-s), which every
# xdist worker would otherwise pay while it collects.

pytestmark = [pytest.mark.flow, pytest.mark.timeout(600), pytest.mark.usefixtures("real_engine_ready")]


# Both ways a replica is lost: its VM deleted (its connections reset, its address free for the bench's observer),
# and its VM silent (every packet to and from it dropped: the front sees no reset, only silence and failed checks).
# SGLang replicas (the default topology) resume through SGLang's own chat layer: the same bench, by a reset only (the
# layer's silence path is the engine's door, shared with vLLM and cut at every token in tests/engine_parsers).
@pytest.mark.parametrize("topology, lose", [("b300x1-vllm", "delete"), ("b300x1-vllm", "unreachable"),
                                            ("h100x4-sglang", "delete")])
def test_a_lost_replica_costs_no_request_and_cuts_no_stream(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            topology: str, lose: str):
    from benchmarks import bench_replicas

    monkeypatch.setenv("FAKE_ENGINE_TOKEN_SECONDS", "0.02")  # restored after; the bench sets it for its nodes
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = bench_replicas.main(["--topology", topology, "--chats", "8", "--before", "4", "--after", "8", "--json",
                                    "--no-kernel-cache", "--lose", lose, "--workdir", str(tmp_path / "sb")])
    assert code == 0
    text = out.getvalue()
    figures = json.loads(text[text.index("{"):])
    print(bench_replicas.format_figures(figures))
    assert figures["requests_before_reclaim"] > 0 and figures["streams_in_flight_at_reclaim"] > 0
    assert figures["failed_non_streamed"] == 0, figures["failures"]
    assert figures["streams_refused_before_first_chunk"] == 0, figures["refused"]
    assert figures["streams_hung"] == 0
    # The streams under way on the lost replica carried on on the twin (the front's resuming layer): none cut,
    # each as the uncut ones of its kind, reasoning and tool calls included.
    assert figures["streams_cut"] == 0, figures["cut"]
    assert figures["streams_wrong"] == 0, figures["wrong"]
    # The bench reclaims once a stream generates on the lost replica (it may still finish first: how many the front
    # carried on is reported, not asserted; tests/engine_parsers/test_resume_chat_layer.py cuts one at every token).
    assert figures["generating_on_lost_replica_at_reclaim"] > 0, figures
    assert figures["streams_open_at_loss_completed"] > 0, figures
    assert figures["tool_round_trips_completed"] == figures["tool_round_trips_started"] > 0
    # Streamed tool turns reach their call (their budget is the fake's whole tool turn). On SGLang replicas one cut
    # inside its tools section is refused resume by design: counted apart (streams_refused_resume_in_tools), printed.
    assert figures["streamed_tool_calls_completed"] > 0, figures
    if lose == "delete":
        # The front's health checker keeps probing the lost address, so probes show the observer there is reachable
        # from the front: without them "nothing more reached it" would prove nothing.
        assert figures["health_probes_to_lost_replica"] > 0, figures["connections_from_elsewhere"]
        assert figures["seconds_until_front_sends_nothing_more"] < 5, figures["reaching_lost_replica"]
    assert figures["front_log_last_try_s"] < 5
    # After the reclaim the load went on through the surviving replica.
    assert figures["requests"] > figures["requests_before_reclaim"]



def test_noisy_neighbours_cost_the_other_clients_no_stream_and_no_request(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch):
    """bench_replicas --noisy: beside a client its engine answers 500 and one that reads nothing of its stream, the
    other clients lose no stream and no request, nothing is sent twice, no replica leaves the pool, and the 5xx
    client gets its engine's own answer. The latencies are printed, not asserted (2 loaded cores)."""
    from benchmarks import bench_replicas

    monkeypatch.setenv("FAKE_ENGINE_TOKEN_SECONDS", "0.02")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = bench_replicas.main(["--noisy", "--chats", "4", "--phase", "8", "--json", "--no-kernel-cache",
                                    "--workdir", str(tmp_path / "sb")])
    assert code == 0
    text = out.getvalue()
    figures = json.loads(text[text.index("{"):])
    print(bench_replicas.format_noisy(figures))
    quiet, noisy = figures["quiet"], figures["noisy"]
    for phase in (quiet, noisy):
        assert phase["requests"] > 0 and phase["streams_completed"] > 0, phase
        assert phase["failed_non_streamed"] == 0, phase["failures"]
        assert phase["streams_cut"] == phase["streams_refused"] == phase["streams_hung"] == 0, phase
        assert phase["sent_again"] == 0 and phase["marked_down_by_a_request"] == 0, phase
        assert phase["engine_requests_begun"] == phase["sent_by_clients"], phase
        assert phase["layer_peak_kib"], phase
    assert set(noisy["five_hundreds_answers"]) == {"500"}, noisy["five_hundreds_answers"]

def _hub_bytes(sandbox, front: set[str]) -> int:
    """The file bytes the hub sent the GPU nodes: everyone but the front (at its `front` addresses), whose render
    server reads the model's config, tokenizer and chat template from it, never a weight."""
    from .conftest import hub_stats

    sent = hub_stats(sandbox.dir.root)["body_bytes_by_client"]
    assert set(sent) & front, sent  # the front's render server did read from the hub
    return sum(int(n) for ip, n in sent.items() if ip not in front)


def test_a_lost_replica_comes_back_from_its_twin_with_no_hub_bytes(tmp_path: Path):
    """First bring-up of 2 replicas: each file from the hub once (1.0x). Reclaim replica 1's head, `up` again: the VM
    is re-created, its weights come from replica 0's node over the fan-out (0 hub bytes), the front serves again."""
    from kimi_cluster.sandbox.kimi import Sandbox

    log = io.StringIO()
    sandbox = Sandbox(tmp_path / "sb", out=log)
    try:
        up = sandbox.up("b300x1-vllm", echo=False, config={"replicas": "2"}, timeline=False, kernel_cache=False)
        assert up == 0, log.getvalue()[-3000:]
        outputs, _ = sandbox.outputs()
        front = {outputs["front_private_ip"], outputs["front_public_ip"]}
        first = _hub_bytes(sandbox, front)
        progress = json.loads((sandbox.dir.nodes / outputs["node_private_ips"][0] / "ephemeral/kimi/progress"
                               / "weights.json").read_text())
        assert first == progress["bytes_total"], (first, progress)  # 1.0x the checkpoint for the whole stack
        lost = outputs["replica_node_names"][1][0]
        sandbox.reclaim(lost)
        assert sandbox.up(None, echo=False, config={"replicas": "2"}, timeline=False) == 0, log.getvalue()[-3000:]
        again, _ = sandbox.outputs()
        assert _hub_bytes(sandbox, front) == first, "the re-created replica pulled from the hub"
        new_ip = again["replica_head_private_ips"][1]
        assert new_ip != outputs["replica_head_private_ips"][1]
        fetched = json.loads((sandbox.dir.nodes / new_ip / "ephemeral/kimi/progress/weights.json").read_text())
        assert fetched["hub_bytes"] == 0 and fetched["peer_bytes"] == progress["bytes_total"], fetched
        assert again["endpoint_url"] == outputs["endpoint_url"]
        assert sandbox.verify() == 0
    finally:
        sandbox.destroy(echo=False)


def test_a_rolling_image_change_restarts_one_replica_at_a_time_with_no_failed_request(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from benchmarks import bench_replicas

    monkeypatch.setenv("FAKE_ENGINE_TOKEN_SECONDS", "0.02")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = bench_replicas.main(["--rolling", "vllm/vllm-openai:kimi-k31-rolled", "--chats", "4", "--before", "3",
                                    "--after", "3", "--json", "--no-kernel-cache", "--workdir", str(tmp_path / "sb")])
    assert code == 0
    text = out.getvalue()
    figures = json.loads(text[text.index("{"):])
    print(bench_replicas.format_rolling(figures))
    assert figures["up_exit"] == 0
    assert figures["failed_non_streamed"] == 0, figures["failures"]
    assert figures["streams_cut"] == 0 and figures["streams_refused_before_first_chunk"] == 0, figures
    assert figures["streams_wrong"] == 0, figures["wrong"]
    # The new image's render server started beside the old one: no stream found none and went unresumed.
    assert figures["resume_logs_read"] == 1 and figures["streams_not_resumed"] == 0, figures["not_resumed"]
    assert figures["tool_round_trips_completed"] == figures["tool_round_trips_started"] > 0
    steps = {(label, step): (start, end) for label, step, start, end in figures["restart_order"]}
    r0_ready_end = steps[("replica 0 node0", "engine-ready")][1]
    r1_launch_start = steps[("replica 1 node0", "launch")][0]
    # Replica 1 restarts only once replica 0 serves again on the new image.
    assert r0_ready_end is not None and r1_launch_start >= r0_ready_end
    assert steps[("replica 0 node0", "launch")][0] < r1_launch_start
