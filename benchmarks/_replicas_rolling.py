"""bench_replicas --rolling: load through the front while `up` changes the engine image, which restarts the replicas
one after the other; what failed, and in which order they restarted."""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

from benchmarks._replicas_front import resume_log_lines, resume_log_sizes
from benchmarks._replicas_load import start_load
from kimi_cluster.sandbox.kimi import Sandbox


def measure_rolling(sandbox: Sandbox, args: argparse.Namespace) -> dict[str, Any]:
    """Load through the front while `up` rolls a new image over the replicas; what failed, and in which order the
    replicas restarted (from the steps' own marks in the state)."""
    from kimi_cluster.operator.timeline_report import bars_from_state

    outputs, _ = sandbox.outputs()
    # The front's resuming layer logs each stream it passes through unresumed: those from the roll on count.
    resume_logs = resume_log_sizes(sandbox.dir.nodes / outputs["front_public_ip"])
    ca, tally, stop, threads = start_load(outputs, args)
    before = tally.requests
    started = time.monotonic()
    code = sandbox.up(None, echo=False, config={"replicas": "2", "image": args.rolling}, timeline=False)
    took = time.monotonic() - started
    time.sleep(args.after)
    stop.set()
    for t in threads:
        t.join(60)
    os.unlink(ca)
    with sandbox.state_document() as state:
        bars = bars_from_state(json.loads(state.read_text()))
    order = [(b.label, b.step, b.start.timestamp(), b.end.timestamp() if b.end else None) for b in bars
             if b.step in ("launch", "engine-ready")]
    unresumed = [line.split("a stream not resumed: ", 1)[1]
                 for line in resume_log_lines(resume_logs, "a stream not resumed: ")]
    return {"image": args.rolling, "up_exit": code, "up_seconds": round(took, 1), "chats": args.chats,
            "requests": tally.requests, "requests_before_up": before,
            "failed_non_streamed": len(tally.failed), "failures": tally.failed[:10],
            "streams_started": tally.streams_started, "streams_completed": tally.streams_done,
            "streams_cut": len(tally.streams_cut), "cut": tally.streams_cut[:10],
            "streams_refused_before_first_chunk": len(tally.stream_refused), "refused": tally.stream_refused[:10],
            "streams_wrong": len(tally.streams_wrong), "wrong": tally.streams_wrong[:10],
            "streams_not_resumed": len(unresumed), "not_resumed": unresumed[:10], "resume_logs_read": len(resume_logs),
            "tool_round_trips_started": tally.trips_started, "tool_round_trips_completed": tally.trips_done,
            "restart_order": sorted(order, key=lambda o: o[2])}


def format_rolling(f: dict[str, Any]) -> str:
    t0 = min((o[2] for o in f["restart_order"]), default=0.0)
    lines = [
        f"rolling image change to {f['image']}: up exit {f['up_exit']} in {f['up_seconds']} s, under {f['chats']} "
        "chats",
        f"{'non-streamed requests through the front':<52} {f['requests']}",
        f"{'failed non-streamed requests':<52} {f['failed_non_streamed']}",
        f"{'streams: started / completed / cut / refused':<52} {f['streams_started']} / {f['streams_completed']} / "
        f"{f['streams_cut']} / {f['streams_refused_before_first_chunk']}",
        f"{'streams not as the first of their kind':<52} {f['streams_wrong']}",
        f"{'streams the front passed through unresumed':<52} {f['streams_not_resumed']}",
        f"{'tool-call round trips completed / started':<52} {f['tool_round_trips_completed']} / "
        f"{f['tool_round_trips_started']}",
        "restart order (s from the first launch):",
    ]
    lines += [f"  {label:<18} {step:<13} {start - t0:7.1f} -> {'' if end is None else f'{end - t0:.1f}'}"
              for label, step, start, end in f["restart_order"]]
    lines += [f"  failed: {x}" for x in f["failures"]] + [f"  cut: {x}" for x in f["cut"]]
    lines += [f"  wrong: {x}" for x in f["wrong"]]
    lines += [f"  refused: {x}" for x in f["refused"]] + [f"  not resumed: {x}" for x in f["not_resumed"]]
    return "\n".join(lines)

