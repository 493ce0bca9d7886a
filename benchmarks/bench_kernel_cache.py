"""Time to ready of a first bring-up cold, a first one with the kernel warm-up, and one restored from the kernel
cache, measured side by side in one run of the sandbox.

    python -m benchmarks.bench_kernel_cache [--topology b300x1-vllm] [--workdir .sandbox-bench]
                                            [--download-seconds S]

Three `sandbox up`s, each followed by `sandbox destroy`:
1. cold: an empty kernel-cache bucket, kimi-cluster:kernelWarmup off; the fake engine compiles at its launch for
   FAKE_COMPILE_SECONDS;
2. warmed: an empty bucket again, kernelWarmup on; the warm-up compiles the same kernels on random weights while
   the fake download runs, and the launch finds them;
3. restored: the bucket the second run saved (it outlives `destroy`, as a team's own bucket outlives the cluster),
   kernelWarmup on; every node restores the archive before its launch, and the warm-up finds nothing to compile.
The fake hub is throttled so that the download takes about --download-seconds (default: the fake compile plus 10 s),
as a node's share of the real checkpoint (4-8 min) outlasts the image pull; each run prints its download and
warm-up times from the steps' own marks. "Ready" is the moment the head's readiness wait passed (its resource lands
in the stack's state file, polled every 0.1 s); the save after it is timed apart. The figures are the sandbox's,
where only the fake compile and the throttled download differ; on GPUs the compile is 10-20 minutes.
"""

from __future__ import annotations

import argparse
import io
import json
import shutil
import sys
import threading
import time
from pathlib import Path

from benchmarks._args import interrupt_on_sigterm, workdir_problem
from kimi_cluster.operator.timeline_report import bars_from_state
from kimi_cluster.sandbox.kimi import TOPOLOGIES, Sandbox
from kimi_cluster.sandbox.nodes import FAKE_COMPILE_SECONDS

READY_RESOURCE = "kimi-ready-wait"
SAVE_RESOURCE = "kimi-kernel-cache-save"


def _landed(state: Path, name: str) -> bool:
    try:
        doc = json.loads(state.read_text())
    except (OSError, ValueError):
        return False
    # The real CLI's checkpoint names each resource by URN (..::NAME).
    resources = ((doc.get("checkpoint") or {}).get("latest") or {}).get("resources") or []
    return any(str(r.get("urn", "")).endswith(f"::{name}") for r in resources)


# The sandbox's fake checkpoint (kimi_cluster/fakes/hub.py tiny_repo): three shards of 4096 float32 values, each read as
# its own
# throttled stream, so one shard's bytes over the rate is the download's length.
SHARD_BYTES = 4096 * 4


def step_seconds(sandbox: Sandbox) -> dict[str, float]:
    """The longest run of each step on any node, from the KIMI-STEP marks in the stack's export (as the timeline
    reads them; the weights step's output is a secret, since its stdin is)."""
    with sandbox.state_document() as state:
        bars = bars_from_state(json.loads(state.read_text()))
    out: dict[str, float] = {}
    for b in bars:
        if b.seconds is not None:
            out[b.step] = max(out.get(b.step, 0.0), b.seconds)
    return out


def timed_up(sandbox: Sandbox, topology: str, config: dict[str, str],
             hub_bytes_per_second: float) -> dict[str, float]:
    """Seconds from the start of `up` to the readiness wait passing, to the save finishing, and to the end; and
    how long the download and the warm-up ran."""
    marks: dict[str, float] = {}
    done = threading.Event()
    state = sandbox.checkpoint_path

    def watch() -> None:
        while not done.is_set():
            for key, name in (("ready", READY_RESOURCE), ("saved", SAVE_RESOURCE)):
                if key not in marks and _landed(state, name):
                    marks[key] = time.monotonic() - started
            done.wait(0.1)

    started = time.monotonic()
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    # The picture is not part of the bring-up timed.
    code = sandbox.up(topology, echo=False, timeline=False, config=config, hub_bytes_per_second=hub_bytes_per_second)
    marks["total"] = time.monotonic() - started
    done.set()
    watcher.join()
    if code != 0:
        raise SystemExit(f"sandbox up failed (exit {code}); see {sandbox.dir.root}")
    steps = step_seconds(sandbox)
    marks.update({step: steps[step] for step in ("weights", "warmup") if step in steps})
    return marks


def engine_lines(sandbox: Sandbox) -> list[str]:
    """What each fake engine (the warm-up's too) said about its kernels."""
    out = []
    logs = sandbox.dir.nodes.glob("*/var/lib/fake-node/docker/containers/kimi-*.log")
    for log in sorted(p for p in logs if p.name in ("kimi-warmup.log", "kimi-engine.log")):
        out += [f"{log.parts[-7]}: {line}" for line in log.read_text().splitlines()
                if "kernels" in line and line.startswith("fake-inference")]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench_kernel_cache", description=__doc__.splitlines()[0])
    ap.add_argument("--topology", choices=TOPOLOGIES, default="b300x1-vllm")
    ap.add_argument("--workdir", default=".sandbox-bench")
    ap.add_argument("--download-seconds", type=float, default=FAKE_COMPILE_SECONDS + 10,
                    help="how long the throttled fake download should take (default: the fake compile plus 10 s)")
    args = ap.parse_args(argv)
    workdir = Path(args.workdir).resolve()
    problem = workdir_problem(workdir)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    if not 1 <= args.download_seconds <= 3600:
        print("error: --download-seconds must be between 1 and 3600", file=sys.stderr)
        return 2
    store = workdir / "kernel-store"
    shutil.rmtree(store, ignore_errors=True)  # an empty bucket: the first up is cold
    quiet = io.StringIO()
    interrupt_on_sigterm()  # a `timeout` or a closed terminal still destroys the sandbox
    sandbox = Sandbox(workdir, out=quiet)
    rate = SHARD_BYTES / args.download_seconds
    print(f"bench: {args.topology} in {workdir}; the fake engine compiles {FAKE_COMPILE_SECONDS} s on an empty "
          f"cache; the fake hub streams each shard at {rate:,.0f} B/s (about {args.download_seconds:g} s)",
          flush=True)
    runs: list[tuple[str, dict[str, float], list[str]]] = []
    plan = [("cold, no warm-up (empty bucket)", "false", True),
            ("cold, warm-up beside the download", "true", True),
            ("restored from the kernel cache", "true", False)]
    try:
        for label, warmup, empty_bucket in plan:
            if empty_bucket:
                shutil.rmtree(store, ignore_errors=True)
            marks = timed_up(sandbox, args.topology, {"kernelWarmup": warmup}, rate)
            runs.append((label, marks, engine_lines(sandbox)))
            if sandbox.destroy(echo=False) != 0:
                raise SystemExit(f"sandbox destroy failed:\n{quiet.getvalue()[-2000:]}")
    finally:
        sandbox.destroy(echo=False)
        shutil.rmtree(store, ignore_errors=True)

    def cell(m: dict[str, float], key: str) -> str:
        return f"{m[key]:8.1f}s" if key in m else f"{'-':>9}"

    print(f"{'bring-up':<36} {'to ready':>9} {'download':>9} {'warm-up':>9} {'save done':>9} {'up total':>9}")
    for label, m, _ in runs:
        print(f"{label:<36} {cell(m, 'ready')} {cell(m, 'weights')} {cell(m, 'warmup')} {cell(m, 'saved')} "
              f"{cell(m, 'total')}")
    cold, warmed, restored = (m.get("ready", float("nan")) for _, m, _ in runs)
    print(f"time to ready, first bring-up with the warm-up over a restored one: {warmed:.1f} s / {restored:.1f} s "
          f"= {warmed / restored:.2f} (cold: {cold:.1f} s / {restored:.1f} s = {cold / restored:.2f})")
    for label, _, lines in runs:
        for line in lines:
            print(f"  {label}: {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
