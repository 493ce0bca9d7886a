"""Benchmark: the 4-node weight download, naive (every node pulls everything) vs sharded with peer fan-out.

    python -m benchmarks.bench_weights [--nodes 4] [--shards 96] [--shard-bytes 2500000] [--cap 4e6] [--json]

One run, on loopback: a fake hub (kimi_cluster/fakes/hub.py) serving a synthetic repository with a bandwidth cap per
client
address, and `kimi_cluster/node/fetch_weights.py` as each node's program, each node on its own loopback address
(127.0.0.2, .3, ...) so the hub sees four clients, exactly as it would see four VMs. Three scenarios run one after
the other: naive, sharded, and sharded with one node killed (SIGKILL) when half of its share has come from the hub.
Hub bytes are what the hub's answers carried (its JSON-lines log), wall time is from the first node's start to the
last one's exit. Nothing here asserts a time; it prints what it measured. The same download through a CDN with slow
edges, against another version's fetcher: benchmarks/bench_weights_edges.py.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from kimi_cluster.fakes.hub import FakeHub, Faults
from kimi_cluster.fakes.hub_repo import synthetic_repo
from kimi_cluster.fakes.sandbox_services import free_port

PROJECT = Path(__file__).resolve().parents[1]
REPO = "moonshotai/Kimi-K3.1-Pro"
REVISION = "6d0a0202956796543364d666ab19c6ad1a494ee1"
TOKEN = "peer-token-for-the-benchmark-only"


@dataclass
class Outcome:
    wall_s: float
    hub_bytes: int
    complete_nodes: int
    killed_rerun_hub_bytes: int | None = None
    exit_s: tuple[float, ...] = ()  # each node's exit, seconds after the first one's start


def node_cmd(work: Path, rank: int, hub: FakeHub, peers: str, poll: float,
             extra: tuple[str, ...] = (), peer_timeout: float = 3.0) -> list[str]:
    d = work / f"node{rank}"
    return [sys.executable, "-m", "kimi_cluster.node.fetch_weights", "--repo", REPO, "--revision", REVISION,
            "--cache-dir", str(d / "hf/hub"), "--record", str(d / "kimi/verified" / f"{REVISION}.json"),
            "--progress-file", str(d / "kimi/progress/weights.json"), "--result-file", str(d / "result"),
            "--endpoint", hub.url, "--workers", "16", "--rank", str(rank), "--peers", peers,
            "--peer-token-file", str(work / "peer_token"), "--peer-timeout", f"{peer_timeout:g}",
            "--stall-seconds", "10",
            "--poll-seconds", str(poll), "--report-seconds", "3600", "--source-address", f"127.0.0.{2 + rank}", *extra]


def run_scenario(work: Path, hub: FakeHub, nodes: int, sharded: bool, kill_halfway: bool,
                 checkpoint: int, program: Path = PROJECT, extra: tuple[str, ...] = (),
                 peer_timeout: float = 3.0) -> Outcome:
    """One download by `nodes` nodes; `program`: the folder whose kimi_cluster/node/fetch_weights.py runs (another
    version's, to compare), given `extra` flags; `peer_timeout`: how long a node waits for a peer that has not
    answered yet (short here, so that the killed node's share moves on soon)."""
    work.mkdir(parents=True)
    (work / "peer_token").write_text(TOKEN + "\n")
    os.chmod(work / "peer_token", 0o600)
    hosts = [f"127.0.0.{2 + r}" for r in range(nodes)]
    peers = ""  # naive: every node alone, every file from the hub
    if sharded:
        port = free_port(*hosts)
        peers = ",".join(f"{h}:{port}" for h in hosts)
    env = {**os.environ, "PYTHONPATH": str(program), "HF_HUB_DISABLE_TELEMETRY": "1", "NO_PROXY": "*"}
    before = sum(hub.sent.values())
    victim = nodes - 1
    victim_addr = hosts[victim]
    share = checkpoint / nodes
    victim_before = hub.sent[victim_addr]  # the hub's counters run across scenarios
    start = time.monotonic()
    logs = [open(work / f"node{r}.log", "w") for r in range(nodes)]
    procs = [subprocess.Popen(node_cmd(work, r, hub, peers, 0.3, extra, peer_timeout), cwd=program, env=env,
                              stdout=logs[r], stderr=subprocess.STDOUT) for r in range(nodes)]
    killed = False
    exits: dict[int, float] = {}
    while any(p.poll() is None for p in procs):
        exits.update((r, time.monotonic() - start) for r, p in enumerate(procs)
                     if r not in exits and p.poll() is not None)
        if kill_halfway and not killed and hub.sent[victim_addr] - victim_before >= share / 2:
            procs[victim].send_signal(signal.SIGKILL)
            killed = True
        time.sleep(0.05)
    wall = time.monotonic() - start
    exits.update((r, wall) for r in range(nodes) if r not in exits)
    for fh in logs:
        fh.close()
    hub_bytes = sum(hub.sent.values()) - before
    results = [work / f"node{r}/result" for r in range(nodes)]
    done = sum(1 for p in results if p.exists() and p.read_text().startswith("ok"))
    out = Outcome(wall, hub_bytes, done, exit_s=tuple(exits[r] for r in range(nodes)))
    if kill_halfway:
        # The killed node's next run: it keeps what it verified; its peers have finished and left, so the rest
        # comes from the hub.
        mark = sum(hub.sent.values())
        rerun = subprocess.run(node_cmd(work, victim, hub, peers, 0.3, extra, peer_timeout), cwd=program, env=env,
                               capture_output=True, text=True)
        out.killed_rerun_hub_bytes = sum(hub.sent.values()) - mark
        out.complete_nodes += 1 if rerun.returncode == 0 else 0
    return out


# Bounds of the benchmark's knobs: past them it measures nothing (no node, no byte) or only fills the disk.
MAX_NODES, MAX_SHARDS, MAX_SHARD_BYTES = 64, 10_000, 10**9


MAX_NAIVE_SECONDS = 3600


def _usage_problem(args: argparse.Namespace) -> str | None:
    """Why these arguments cannot make a benchmark, or None; asked before the hub starts."""
    for flag, value, top in (("--nodes", args.nodes, MAX_NODES), ("--shards", args.shards, MAX_SHARDS),
                             ("--shard-bytes", args.shard_bytes, MAX_SHARD_BYTES)):
        if not 1 <= value <= top:
            return f"{flag} {value} is not between 1 and {top:,}"
    if not (math.isfinite(args.cap) and args.cap > 0):
        return f"--cap {args.cap:g} is not a positive number of bytes per second"
    # The naive run fetches the whole checkpoint per node at the cap: past an hour the benchmark never ends in use.
    floor = args.shards * args.shard_bytes / MAX_NAIVE_SECONDS
    if args.cap < floor:
        return (f"--cap {args.cap:g} bytes per second fetches the {args.shards * args.shard_bytes / 1e6:,.1f} MB "
                f"checkpoint in more than {MAX_NAIVE_SECONDS // 60} minutes; give at least {floor:,.0f}")
    if args.keep and os.path.exists(args.keep) and not os.path.isdir(args.keep):
        return f"--keep {args.keep} is a file; give a directory (it is created if missing)"
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench_weights", description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--shards", type=int, default=96)
    ap.add_argument("--shard-bytes", type=int, default=2_500_000)
    ap.add_argument("--cap", type=float, default=4e6, help="hub bytes per second per client address")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--keep", help="keep every node's directory and log here instead of a temporary directory")
    args = ap.parse_args(argv)
    problem = _usage_problem(args)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2

    files = synthetic_repo(args.shards, args.shard_bytes)
    checkpoint = sum(len(f.data) for f in files)
    with tempfile.TemporaryDirectory(prefix="bench-weights-") as scratch:
        tmp = args.keep or scratch
        os.makedirs(tmp, exist_ok=True)
        log = os.path.join(tmp, "hub.jsonl")
        with FakeHub(REPO, REVISION, files, faults=Faults(client_bytes_per_second=args.cap), log_file=log) as hub:
            naive = run_scenario(Path(tmp) / "naive", hub, args.nodes, False, False, checkpoint)
            sharded = run_scenario(Path(tmp) / "sharded", hub, args.nodes, True, False, checkpoint)
            killed = run_scenario(Path(tmp) / "killed", hub, args.nodes, True, True, checkpoint)
        with open(log, encoding="utf-8") as fh:
            answers = sum(1 for _ in fh)
    figures = {
        "checkpoint_bytes": checkpoint,
        "cap_bytes_per_second_per_client": args.cap,
        "nodes": args.nodes,
        "naive_hub_ratio": naive.hub_bytes / checkpoint,
        "sharded_hub_ratio": sharded.hub_bytes / checkpoint,
        "naive_wall_s": naive.wall_s,
        "sharded_wall_s": sharded.wall_s,
        "wall_ratio": sharded.wall_s / naive.wall_s,
        "killed_hub_ratio": killed.hub_bytes / checkpoint,
        "killed_wall_s": killed.wall_s,
        "killed_survivors_complete": killed.complete_nodes - 1,
        "killed_rerun_hub_ratio": (killed.killed_rerun_hub_bytes or 0) / checkpoint,
        "killed_all_complete": killed.complete_nodes == args.nodes,
        "naive_complete": naive.complete_nodes, "sharded_complete": sharded.complete_nodes,
        "hub_answers_logged": answers,
    }
    if args.json:
        print(json.dumps(figures, indent=2))
        return 0
    n = args.nodes
    print(f"{n} nodes on loopback, {args.shards} shards, checkpoint {checkpoint / 1e6:,.1f} MB, hub capped at "
          f"{args.cap / 1e6:g} MB/s per client address ({answers} hub answers logged)")
    print(f"{'figure':<58} {'measured':>10}  goal")
    print(f"{'hub bytes / checkpoint bytes, naive':<58} {figures['naive_hub_ratio']:>10.3f}  {n}.0")
    print(f"{'hub bytes / checkpoint bytes, sharded':<58} {figures['sharded_hub_ratio']:>10.3f}  <= 1.02")
    print(f"{'wall time, sharded / naive':<58} {figures['wall_ratio']:>10.3f}  <= 0.35"
          f"   ({sharded.wall_s:.1f} s vs {naive.wall_s:.1f} s)")
    print(f"{'hub bytes / checkpoint, one node killed halfway':<58} {figures['killed_hub_ratio']:>10.3f}  <= 1.30"
          f"   ({figures['killed_survivors_complete']}/{n - 1} survivors complete in {killed.wall_s:.1f} s)")
    print(f"{'  + the killed node re-run afterwards, from the hub':<58} {figures['killed_rerun_hub_ratio']:>10.3f}"
          f"        ({'complete' if figures['killed_all_complete'] else 'INCOMPLETE'}; its peers had left)")
    ok = naive.complete_nodes == n and sharded.complete_nodes == n and figures["killed_all_complete"]
    if not ok:
        print("ERROR: a node did not finish; see the figures above", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
