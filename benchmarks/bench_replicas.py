"""Lose a replica under load: N concurrent chats through the front, one replica's head reclaimed in the middle.

    python -m benchmarks.bench_replicas [--topology b300x1-vllm] [--chats 16] [--token-seconds 0.02]
                                        [--before 6] [--after 12] [--lose delete|unreachable] [--json]
                                        [--workdir .sandbox-bench-replicas]
    python -m benchmarks.bench_replicas --rolling IMAGE ...        # an image change under load instead
    python -m benchmarks.bench_replicas --noisy [--phase 20] [--rounds 1] [--noisy-interval 0.25] ...

Brings up a 2-replica sandbox (FAKE_ENGINE_TOKEN_SECONDS paces every answer, so requests are in flight), runs
`--chats` workers through the front (benchmarks/_replicas_load.py: half tool-call round trips, half streams). After
`--before` seconds the head of replica 1 is lost (`sandbox reclaim`: the emulator deletes the VM and its node is gone,
or with `--lose unreachable` every packet to and from it is dropped); the load goes on for `--after` seconds. Then it
prints:

- failed non-streamed requests (each with the client's error);
- streams started, completed and cut (a cut stream ends with an error; one still open when the load stops hangs),
  and those whose assembled message differs from the first of their kind (`streams_wrong`);
- `longest_resume_gap_s`: of the streams open at the loss, the longest wait for a chunk from the loss on (across the
  cut: a stream carried on on the twin waits for its first chunk from there);
- generations the front's resuming layer carried on on the twin (its log);
- tool-call round trips completed of those started (non-streamed);
- streamed tool turns that finished with their call (`tool_calls`) of those started: their `max_tokens` is the fake
  engines' whole tool turn, reasoning and tools section up to EOS (`_replicas_load.tool_turn_tokens`);
- streams the front's resuming layer refused to carry on because their cut fell inside the tools section (SGLang
  0.5.23 restarts a tool turn's structural tag at a resumed request's first token): each ends with an error event
  saying so, and is counted here, not in the cut or wrong streams; so are those refused because their cut fell part
  way into a stop string, the end of reasoning or the tools opening (SGLang's layer: the twin would not see it whole);
- seconds from the reclaim until the front sent its last request to the lost replica. An observer takes the lost
  replica's address and engine port the moment its VM is gone and records every request line that reaches it from
  the front's private address (any other sender is listed apart); the front's active health probes (GET /health)
  are counted apart. A silent replica has no observer: the front's own
  log of failed tries says when it stopped trying.

`--rolling` (benchmarks/_replicas_rolling.py) changes the engine image under the load instead; `--noisy`
(benchmarks/_replicas_noisy.py) loses nothing, and sets the load side by side without and with two noisy neighbours:
a client the engine answers 500, and one that stops reading its stream.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks._args import interrupt_on_sigterm, number_problem, workdir_problem
from benchmarks._replicas_front import Observer, front_tries, generations_on, resume_log_lines, resume_log_sizes
from benchmarks._replicas_load import start_load, tool_turn_tokens
from benchmarks._replicas_noisy import format_noisy, measure_noisy
from benchmarks._replicas_rolling import format_rolling, measure_rolling
from kimi_cluster.fakes.node_fabric import Fabric, FabricConfig
from kimi_cluster.sandbox.kimi import TOPOLOGIES, Sandbox

# Beyond these the figures mean nothing: more chats than the fake engines' slots, a decode slower than a second a
# token, or a load phase longer than an hour.
MAX_CHATS, MAX_TOKEN_SECONDS, MAX_PHASE_SECONDS = 256, 1.0, 3600.0
MAX_ROUNDS = 20


def _usage_problem(args: argparse.Namespace, workdir: Path) -> str | None:
    if not 1 <= args.chats <= MAX_CHATS:
        return f"--chats {args.chats} is not between 1 and {MAX_CHATS}"
    return (number_problem("--token-seconds", args.token_seconds, 0, MAX_TOKEN_SECONDS)
            or number_problem("--before", args.before, 0, MAX_PHASE_SECONDS)
            or number_problem("--after", args.after, 0, MAX_PHASE_SECONDS)
            or number_problem("--phase", args.phase, 0, MAX_PHASE_SECONDS)
            or number_problem("--noisy-interval", args.noisy_interval, 0, MAX_PHASE_SECONDS, low_open=False)
            or (None if 1 <= args.rounds <= MAX_ROUNDS else f"--rounds {args.rounds} is not between 1 and {MAX_ROUNDS}")
            or (args.noisy and args.rolling and "--noisy and --rolling measure two things: give one")
            or workdir_problem(workdir) or _rolling_problem(args) or _render_server_problem(args))


def _render_server_problem(args: argparse.Namespace) -> str | None:
    """The front's chat layer needs the parsers venv (a real vLLM, or SGLang 0.5.23's Python): said before the
    bring-up, as `sandbox up` says it."""
    from kimi_cluster.sandbox.nodes import render_server_problem, stack_settings
    from kimi_cluster.settings import SettingsError

    try:
        return render_server_problem(stack_settings(args.topology, {"replicas": "2"}))
    except SettingsError:  # a shape the bring-up itself refuses, naming the key
        return None


def _rolling_problem(args: argparse.Namespace) -> str | None:
    """--rolling's image, checked as the stack's `up` will check it: before the first bring-up, not after it."""
    if args.rolling is None:
        return None
    from kimi_cluster.sandbox.nodes import stack_settings
    from kimi_cluster.settings import SettingsError

    try:
        stack_settings(args.topology, {"replicas": "2", "image": args.rolling})
    except SettingsError as err:
        lines = [line.strip() for line in str(err).splitlines()[1:] if line.strip()]
        return f"--rolling: {'; '.join(lines) or err}"
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench_replicas", description=__doc__.splitlines()[0])
    ap.add_argument("--topology", choices=TOPOLOGIES, default="b300x1-vllm")
    ap.add_argument("--chats", type=int, default=16, help="concurrent chats (half tool round trips, half streams)")
    ap.add_argument("--token-seconds", type=float, default=0.02, help="the fake engines' decode time per token")
    ap.add_argument("--before", type=float, default=6.0, help="seconds of load before the reclaim")
    ap.add_argument("--after", type=float, default=12.0, help="seconds of load after it")
    ap.add_argument("--lose", choices=["delete", "unreachable"], default="delete",
                    help="how replica 1's head goes: its VM deleted (the address answers nothing: a reset at once) "
                         "or unreachable (still ACTIVE, every packet dropped, as a lost cloud host usually is)")
    ap.add_argument("--workdir", default=".sandbox-bench-replicas")
    ap.add_argument("--keep", action="store_true", help="leave the sandbox up afterwards")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    ap.add_argument("--no-kernel-cache", action="store_true",
                    help="deploy without the sandbox's kernel-cache bucket and its steps (they do not change what "
                         "is measured here)")
    ap.add_argument("--rolling", metavar="IMAGE",
                    help="instead of a reclaim: change the engine image to IMAGE with `up` under the load, and count "
                         "what fails while the replicas restart one after the other")
    ap.add_argument("--noisy", action="store_true",
                    help="instead of a reclaim: the load without, then with, two noisy neighbours (a client the "
                         "engine answers 500, one that stops reading its stream), side by side")
    ap.add_argument("--phase", type=float, default=20.0, help="--noisy: seconds of each phase")
    ap.add_argument("--rounds", type=int, default=1, help="--noisy: how many times a quiet phase then a noisy one")
    ap.add_argument("--noisy-interval", type=float, default=0.25,
                    help="--noisy: seconds the 5xx client waits between two of its requests")
    args = ap.parse_args(argv)
    workdir = Path(args.workdir).resolve()
    problem = _usage_problem(args, workdir)
    if problem:  # before the bring-up, which takes minutes
        print(f"error: {problem}", file=sys.stderr)
        return 2
    os.environ["FAKE_ENGINE_TOKEN_SECONDS"] = str(args.token_seconds)  # reaches the engines through the nodes' env
    log = io.StringIO()
    interrupt_on_sigterm()  # a `timeout` or a closed terminal still destroys the sandbox
    sandbox = Sandbox(workdir, out=log)
    print(f"bench: 2 x {args.topology} behind a front in {workdir}; {args.chats} chats, "
          f"{args.token_seconds * 1000:.0f} ms per token", flush=True)
    started = time.monotonic()
    try:
        if sandbox.up(args.topology, echo=False, config={"replicas": "2"}, timeline=False,
                      kernel_cache=False if args.no_kernel_cache else None) != 0:
            raise SystemExit(f"sandbox up failed:\n{log.getvalue()[-3000:]}")
        print(f"bench: up in {time.monotonic() - started:.1f} s", flush=True)
        figures = (measure_rolling(sandbox, args) if args.rolling else measure_noisy(sandbox, args) if args.noisy
                   else measure(sandbox, args, log))
    finally:
        if not args.keep:
            sandbox.destroy(echo=False)
    if args.json:
        print(json.dumps(figures, indent=2))
    else:
        print(format_rolling(figures) if args.rolling else format_noisy(figures) if args.noisy
              else format_figures(figures))
    return 0


def measure(sandbox: Sandbox, args: argparse.Namespace, log: io.StringIO) -> dict[str, Any]:
    outputs, _ = sandbox.outputs()
    lost = outputs["replica_node_names"][1][0]
    lost_ip = outputs["replica_head_private_ips"][1]
    engine_port = int(sandbox.dir.record()["engine_port"])
    ca, tally, stop, threads = start_load(outputs, args)
    fabric = FabricConfig.load(sandbox.dir.root / "fabric.json")
    # The reclaim waits (up to a minute) for a stream generating on the lost replica, so that one is carried on.
    generating = generations_on(fabric, outputs["front_public_ip"], f"http://{lost_ip}:{engine_port}", 60.0)
    before = {"requests": tally.requests, "streams": tally.streams_started, "in_flight_streams": tally.open_streams}
    reclaimed_at, reclaimed_wall = time.monotonic(), time.time()
    tally.loss_at = reclaimed_at
    sandbox.reclaim(lost, args.lose)
    # A deleted VM's address is free: the observer takes it. A silent one keeps it, and drops what reaches it.
    observer = Observer(Fabric(fabric), lost_ip, engine_port) \
        if args.lose == "delete" else None
    where = f"observer on {lost_ip}:{engine_port} after {observer.bound_at - reclaimed_at:.2f} s" if observer \
        else "no observer: its packets are dropped"
    print(f"bench: {log.getvalue().strip().splitlines()[-1]}; {where}", flush=True)
    time.sleep(args.after)
    stop.set()
    deadline = time.monotonic() + 60
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    hung = sum(1 for t in threads if t.is_alive())
    seen = observer.seen if observer else []
    if observer:
        observer.close()
    os.unlink(ca)
    # Only what the front sends counts: the observer's address is a bare namespace, with no firewall of its own.
    front, health = outputs["front_private_ip"], ("GET /health", "HEAD /health")
    proxied = [(t - reclaimed_at, line) for t, peer, line in seen if peer == front and not line.startswith(health)]
    probes = [t - reclaimed_at for t, peer, line in seen if peer == front and line.startswith(health)]
    elsewhere = [f"{t - reclaimed_at:.2f} s from {peer}: {line[:80]}" for t, peer, line in seen if peer != front]
    front_dir = sandbox.dir.nodes / outputs["front_public_ip"]
    tried = front_tries(front_dir, f"{lost_ip}:{engine_port}", reclaimed_wall)
    carried = resume_log_lines(resume_log_sizes(front_dir, empty=True), ": carried on by ")
    return {
        "front_log_last_try_s": round(max(tried, default=0.0), 2), "front_log_tries": len(tried),
        "lost_replica_head": lost, "lost_as": args.lose, "chats": args.chats, "token_seconds": args.token_seconds,
        "requests": tally.requests, "requests_before_reclaim": before["requests"],
        "streams_in_flight_at_reclaim": before["in_flight_streams"],
        "failed_non_streamed": len(tally.failed), "failures": tally.failed[:10],
        "streams_started": tally.streams_started, "streams_completed": tally.streams_done,
        "streams_cut": len(tally.streams_cut), "cut": tally.streams_cut[:10],
        "streams_refused_before_first_chunk": len(tally.stream_refused), "refused": tally.stream_refused[:10],
        "streams_hung": hung, "streams_wrong": len(tally.streams_wrong), "wrong": tally.streams_wrong[:10],
        "streams_open_at_loss_completed": len(tally.resume_gaps),
        "generating_on_lost_replica_at_reclaim": generating,
        "carried_on_by_the_twin": len(carried), "carried": carried[:10],
        "longest_resume_gap_s": round(max(tally.resume_gaps, default=0.0), 2),
        "tool_round_trips_started": tally.trips_started, "tool_round_trips_completed": tally.trips_done,
        "streamed_tool_turns_started": tally.tool_streams_started,
        "streamed_tool_calls_completed": tally.tool_streams_called,
        "streamed_tool_turn_max_tokens": tool_turn_tokens(),
        "streams_refused_resume_in_tools": len(tally.refused_in_tools),
        "refused_resume_in_tools": tally.refused_in_tools[:10],
        "streams_refused_resume_part_way_into_a_marker": len(tally.refused_in_marker),
        "refused_resume_part_way_into_a_marker": tally.refused_in_marker[:10],
        "requests_reaching_lost_replica_after_reclaim": len(proxied),
        "seconds_until_front_sends_nothing_more": round(max((t for t, _ in proxied), default=0.0), 2),
        "health_probes_to_lost_replica": len(probes),
        "reaching_lost_replica": [f"{t:.2f} s: {line[:80]}" for t, line in proxied[:10]],
        "connections_from_elsewhere": elsewhere[:10],
    }



def format_figures(f: dict[str, Any]) -> str:
    lines = [
        f"lost replica head: {f['lost_replica_head']} ({f['lost_as']}, after {f['requests_before_reclaim']} requests, "
        f"{f['streams_in_flight_at_reclaim']} streams in flight)",
        f"{'non-streamed requests through the front':<52} {f['requests']}",
        f"{'failed non-streamed requests':<52} {f['failed_non_streamed']}",
        f"{'streams: started / completed / cut / refused / hung':<52} {f['streams_started']} / "
        f"{f['streams_completed']} / {f['streams_cut']} / {f['streams_refused_before_first_chunk']} / "
        f"{f['streams_hung']}",
        f"{'streams not as the first of their kind':<52} {f['streams_wrong']}",
        f"{'longest wait for a chunk from the loss on, s':<52} {f['longest_resume_gap_s']} "
        f"(over {f['streams_open_at_loss_completed']} streams open at the loss that completed)",
        f"{'generations the front carried on on the twin':<52} {f['carried_on_by_the_twin']} "
        f"({f['generating_on_lost_replica_at_reclaim']} generating on the lost replica at the reclaim)",
        f"{'tool-call round trips completed / started':<52} {f['tool_round_trips_completed']} / "
        f"{f['tool_round_trips_started']} (non-streamed)",
        f"{'streamed tool turns: finished with a call / started':<52} {f['streamed_tool_calls_completed']} / "
        f"{f['streamed_tool_turns_started']} (max_tokens {f['streamed_tool_turn_max_tokens']}, the fake's whole "
        "tool turn)",
        f"{'streams refused resume: cut inside the tools section':<52} {f['streams_refused_resume_in_tools']} "
        "(SGLang restarts a tool turn's structural tag at a resumed request's first token)",
        f"{'streams refused resume: cut part way into a marker':<52} "
        f"{f['streams_refused_resume_part_way_into_a_marker']} (a stop string, the end of reasoning or the tools "
        "opening, which the twin would not see whole)",
        f"{'seconds until the front sends nothing more to it':<52} {f['seconds_until_front_sends_nothing_more']} "
        f"({f['requests_reaching_lost_replica_after_reclaim']} requests reached it after the reclaim; "
        f"{f['health_probes_to_lost_replica']} health probes)",
        f"{'last failed try the front logged for it, s':<52} {f['front_log_last_try_s']} "
        f"({f['front_log_tries']} failed tries in the front's log after the reclaim)",
    ]
    lines += [f"  failed: {x}" for x in f["failures"]]
    lines += [f"  cut: {x}" for x in f["cut"]] + [f"  wrong: {x}" for x in f["wrong"]]
    lines += [f"  refused: {x}" for x in f["refused"]]
    lines += [f"  refused resume in the tools section: {x}" for x in f["refused_resume_in_tools"]]
    lines += [f"  refused resume part way into a marker: {x}" for x in f["refused_resume_part_way_into_a_marker"]]
    lines += [f"  reached the lost replica at {x}" for x in f["reaching_lost_replica"]]
    lines += [f"  not from the front, at {x}" for x in f["connections_from_elsewhere"]]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
