"""Benchmark: the weight download through a CDN with slow edges, this fetcher against another version's, in one run.

    python -m benchmarks.bench_weights_edges --baseline 4273dcf [--slow-edges 0.7] [--slow-edge-factor 0.125] [--json]

The fake hub (kimi_cluster/fakes/hub.py) caps every connection at its edge's rate, drawn per request from a seed
(kimi_cluster/fakes/hub_edges.py): `--slow-edges` of the requests land on an edge capped at `--slow-edge-factor`
of the fast rate, as huggingface/xet-core#821 measured (65-75% of edges at 8.7 MB/s against ~68 MB/s). Each node
also has a link (the per-client cap) narrower than its 16 streams on fast edges, as a VM's ingress is. Each fetcher
downloads on one node and on four (sharded, with peers), with slow edges and without, interleaved; the figures are
wall time with slow edges / wall time without, and hub bytes / checkpoint bytes.

`--baseline` is a folder holding another version of kimi_cluster/ or a git ref of this repository, exported to a
temporary folder for the run (e.g. 4273dcf, release 0.3.0, the fetcher before floors and split tails). The new
fetcher's floor is scaled to the fake's rates as the defaults are to the hub's (the minimum at 10/68 of the fast
rate); its window derives from the rates it measures, as on the hub, with `--min-window` under it.

The scale keeps the hub's ratios, not its sizes. On `h100x4-sglang` a node fetches 24 of the 96 shards of 16.3 GB
with 16 streams, 1.5 shards a stream, and a shard on a fast edge takes 16.3 GB / 68 MB/s = 240 s, 25 windows of
9.6 s (4% of it). Here every node has `--shards-per-node` (24) shards of 3 MB at 0.25 MB/s a fast edge: 1.5 shards
a stream and 12 s a shard, 24 windows of 0.5 s. The window cannot shrink with the rest: a loaded test machine's
scheduling stalls a thread for tenths of a second, so `--min-window` 0.5 s. The checkpoint grows with the cluster
(96 shards on four nodes), so that each node's share, and so the time a stream's search for a fast edge is set
against, is the same at every size (at 48 MB a node a whole share took 13 windows, against 37 on h100x4-sglang).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.bench_weights import PROJECT, REPO, REVISION, run_scenario
from kimi_cluster.fakes.hub import Edges, FakeHub, Faults
from kimi_cluster.fakes.hub_repo import synthetic_repo
from kimi_cluster.node.weights import HUB_FLOOR_SHARE, HUB_MIN_RATE
from kimi_cluster.node.weights_files import CHUNK
from kimi_cluster.node.weights_transfer import READ_BACK

FAST_EDGE_ON_THE_HUB = 68e6  # bytes/s per connection on a fast edge (xet-core#821), what HUB_MIN_RATE is set against


def export(baseline: str, into: Path) -> Path:
    """The folder to run the baseline from: `baseline` itself if it holds kimi_cluster/, else a git ref exported."""
    if (Path(baseline) / "kimi_cluster" / "node" / "fetch_weights.py").exists():
        return Path(baseline)
    into.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(PROJECT), "archive", baseline], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into


def progress(work: Path, rank: int) -> dict:
    """What a node's progress file said last (empty if it wrote none)."""
    try:
        return dict(json.loads((work / f"node{rank}/kimi/progress/weights.json").read_text()))
    except (OSError, ValueError):
        return {}


def read_back_rate(folder: Path, nbytes: int = 64 * 2**20) -> float:
    """Bytes/s at which this machine hashes a file back from the page cache as the in-order hash does (sha256 of
    8 MiB preads of a file just written), to price the bytes the split tail read back."""
    path = folder / "read-back"
    path.write_bytes(os.urandom(nbytes))
    fd = os.open(path, os.O_RDONLY)
    try:
        h, start = hashlib.sha256(), time.perf_counter()
        for off in range(0, nbytes, READ_BACK):
            h.update(os.pread(fd, READ_BACK, off))
        return nbytes / (time.perf_counter() - start)
    finally:
        os.close(fd)
        path.unlink()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench_weights_edges", description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", required=True, help="a folder with another kimi_cluster/, or a git ref (main)")
    ap.add_argument("--shards-per-node", type=int, default=24, help="the checkpoint's shards, per node")
    ap.add_argument("--shard-bytes", type=int, default=3_000_000)
    ap.add_argument("--edge-rate", type=float, default=0.25e6, help="bytes/s per connection on a fast edge")
    ap.add_argument("--min-window", type=float, default=0.5, help="the new fetcher's --hub-window (its least)")
    ap.add_argument("--link", type=float, default=12.0, help="each node's link, in fast connections' worth")
    ap.add_argument("--slow-edges", type=float, default=0.7, help="share of requests landing on a slow edge")
    ap.add_argument("--slow-edge-factor", type=float, default=1 / 8, help="a slow edge's rate over a fast one's")
    ap.add_argument("--seed", type=int, default=54)
    ap.add_argument("--nodes", default="1,4", help="cluster sizes to run, comma-separated")
    ap.add_argument("--fetchers", default="baseline,new", help="which to run, comma-separated")
    ap.add_argument("--keep", help="keep every node's directory and log here instead of a temporary directory")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    # Both fetchers report their progress to their peers a MiB at a time, so a peer whose every stream sits on a slow
    # edge moves once per MiB at its rate: the stall timeout is twice that, as the hub's 180 s is well above the
    # 0.12 s a MiB takes at 8.7 MB/s (at the 10 s bench_weights uses, peers on slow edges were given up as stalled).
    stall = ("--stall-seconds", f"{max(10.0, 2 * CHUNK / (args.edge_rate * args.slow_edge_factor)):.0f}")
    new_flags = (*stall, "--hub-min-rate", f"{args.edge_rate * HUB_MIN_RATE / FAST_EDGE_ON_THE_HUB:.0f}",
                 "--hub-floor-share", str(HUB_FLOOR_SHARE), "--hub-window", f"{args.min_window:g}")
    sizes = [int(n) for n in args.nodes.split(",")]
    rows: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="bench-edges-") as scratch:
        tmp = args.keep or scratch
        baseline = export(args.baseline, Path(tmp) / "baseline")
        fetchers = {name: run for name, run in (("baseline", (baseline, stall)), ("new", (PROJECT, new_flags)))
                    if name in args.fetchers.split(",")}
        for nodes in sizes:
            files = synthetic_repo(args.shards_per_node * nodes, args.shard_bytes)
            checkpoint = sum(len(f.data) for f in files)
            for f in files:  # hashed before the first run, so that no run's manifest waits for them
                _ = f.etag
            faults = Faults(client_bytes_per_second=args.link * args.edge_rate)
            with FakeHub(REPO, REVISION, files, faults=faults) as hub:
                for name, (program, extra) in fetchers.items():
                    for slow in (0.0, args.slow_edges):
                        faults.edges = Edges(slow, args.slow_edge_factor, args.edge_rate, args.seed)
                        key = f"{name} {nodes} {'slow' if slow else 'none'}"
                        work = Path(tmp) / key.replace(" ", "-")
                        # A node that has not answered its peers is waited for a while: slow starts on a loaded
                        # machine are not what this measures (at 3 s, a node read the manifest late and lost its share).
                        out = run_scenario(work, hub, nodes, nodes > 1, False, checkpoint, program, extra,
                                           peer_timeout=60.0)
                        per_node = [progress(work, r) for r in range(nodes)]
                        rows[key] = {"wall_s": out.wall_s, "hub_ratio": out.hub_bytes / checkpoint,
                                     "checkpoint_bytes": checkpoint,
                                     "complete": out.complete_nodes == nodes,
                                     "reopens": sum(p.get("hub_reopens", 0) for p in per_node),
                                     "reread_bytes": sum(p.get("hash_reread_bytes", 0) for p in per_node),
                                     "slow_edges_drawn": faults.edges.drawn["slow"],
                                     "fast_edges_drawn": faults.edges.drawn["fast"],
                                     "nodes": [{"exit_s": round(t, 1), "hub_bytes": p.get("hub_bytes", 0),
                                                "peer_bytes": p.get("peer_bytes", 0),
                                                "reopens": p.get("hub_reopens", 0)}
                                               for t, p in zip(out.exit_s, per_node, strict=True)]}
                        print(f"  {key}: {out.wall_s:.1f} s, hub {rows[key]['hub_ratio']:.3f} x, "
                              f"{rows[key]['reopens']} re-opens; per node (exit s, hub MB, peer MB, re-opens): "
                              + ", ".join(f"({n['exit_s']:g}, {n['hub_bytes'] / 1e6:.0f}, "
                                          f"{n['peer_bytes'] / 1e6:.0f}, {n['reopens']})" for n in rows[key]["nodes"]),
                              file=sys.stderr, flush=True)
        hash_rate = read_back_rate(Path(tmp))
    figures = {"read_back_hash_bytes_per_second": hash_rate, "shards_per_node": args.shards_per_node,
               "shard_bytes": args.shard_bytes, "edge_rate": args.edge_rate,
               "link_bytes_per_second": args.link * args.edge_rate, "slow_edges": args.slow_edges,
               "slow_edge_factor": args.slow_edge_factor, "seed": args.seed, "new_flags": list(new_flags),
               "runs": rows}
    ok = all(r["complete"] for r in rows.values())
    if args.json:
        print(json.dumps(figures, indent=2))
        return 0 if ok else 1
    print(f"{args.shards_per_node} shards of {args.shard_bytes / 1e6:g} MB a node; edges "
          f"{args.edge_rate / 1e6:g} MB/s per connection, {args.slow_edges:.0%} of requests at "
          f"{args.slow_edge_factor:g} of it (seed {args.seed}); "
          f"each node's link {args.link * args.edge_rate / 1e6:g} MB/s; both fetchers {' '.join(stall)}; new fetcher: "
          f"{' '.join(new_flags[2:])}")
    print(f"{'nodes':>5} {'fetcher':<9} {'slow/none wall':>15} {'(s)':>14} {'hub/ckpt slow':>14} {'none':>6} "
          f"{'re-opens':>9} {'hashed back MB':>15}")
    for nodes in sizes:
        for name in fetchers:
            slow, none = rows[f"{name} {nodes} slow"], rows[f"{name} {nodes} none"]
            goal = "  goal <= 1.25, <= 1.02" if name == "new" else ""
            print(f"{nodes:>5} {name:<9} {slow['wall_s'] / none['wall_s']:>15.2f} "
                  f"{slow['wall_s']:>6.1f} / {none['wall_s']:<5.1f} {slow['hub_ratio']:>14.3f} "
                  f"{none['hub_ratio']:>6.3f} {slow['reopens']:>9} {slow['reread_bytes'] / 1e6:>15.1f}{goal}")
    most = max(r["reread_bytes"] for r in rows.values())
    share = max(r["reread_bytes"] / r["checkpoint_bytes"] for r in rows.values())
    print(f"The split tail's bytes are hashed in order, read back from the page cache: at most {most / 1e6:,.1f} MB "
          f"in a run (at most {share:.1%} of the checkpoint), at {hash_rate / 1e6:,.0f} MB/s on this machine "
          f"({most / hash_rate:.2f} s of one core)")
    if not ok:
        print("ERROR: a node did not finish", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    os.environ.setdefault("NO_PROXY", "*")
    sys.exit(main())
