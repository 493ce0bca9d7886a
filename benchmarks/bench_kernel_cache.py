"""Time to ready with and without a kept kernel cache, measured side by side in one run of the sandbox.

    python -m benchmarks.bench_kernel_cache [--topology b300x1-vllm] [--workdir .sandbox-bench]

Runs `sandbox up` on an empty kernel-cache bucket (the fake engine compiles for FAKE_COMPILE_SECONDS), `sandbox
destroy` (the bucket is kept, as a team's own bucket outlives the cluster), `sandbox up` again (every node restores
the archive before its launch), then destroys everything, the bucket included. "Ready" is the moment the head's
readiness wait passed (its resource lands in the engine's state file, polled every 0.1 s); the save after it is
timed apart. The figures are the sandbox's, where only the fake compile differs; on GPUs the compile is minutes.
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

from benchmarks._args import workdir_problem
from sandbox.kimi import TOPOLOGIES, Sandbox
from sandbox.nodes import FAKE_COMPILE_SECONDS

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


def timed_up(sandbox: Sandbox, topology: str) -> dict[str, float]:
    """Seconds from the start of `up` to the readiness wait passing, to the save finishing, and to the end."""
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
    code = sandbox.up(topology, echo=False, timeline=False)  # the picture is not part of the bring-up timed
    marks["total"] = time.monotonic() - started
    done.set()
    watcher.join()
    if code != 0:
        raise SystemExit(f"sandbox up failed (exit {code}); see {sandbox.dir.root}")
    return marks


def engine_lines(sandbox: Sandbox) -> list[str]:
    """What each fake engine said about its kernels, and what each restore said."""
    out = []
    for log in sorted(sandbox.dir.nodes.glob("*/var/lib/fake-node/docker/containers/kimi-engine.log")):
        out += [f"{log.parts[-7]}: {line}" for line in log.read_text().splitlines()
                if "kernels" in line and line.startswith("fake-inference")]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench_kernel_cache", description=__doc__.splitlines()[0])
    ap.add_argument("--topology", choices=TOPOLOGIES, default="b300x1-vllm")
    ap.add_argument("--workdir", default=".sandbox-bench")
    args = ap.parse_args(argv)
    workdir = Path(args.workdir).resolve()
    problem = workdir_problem(workdir)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    shutil.rmtree(workdir / "kernel-store", ignore_errors=True)  # an empty bucket: the first up is cold
    quiet = io.StringIO()
    sandbox = Sandbox(workdir, out=quiet)
    print(f"bench: {args.topology} in {workdir}; the fake engine compiles {FAKE_COMPILE_SECONDS} s on an empty "
          "cache", flush=True)
    try:
        first = timed_up(sandbox, args.topology)
        first_lines = engine_lines(sandbox)
        if sandbox.destroy(echo=False) != 0:
            raise SystemExit(f"sandbox destroy failed:\n{quiet.getvalue()[-2000:]}")
        kept = sum(1 for p in (workdir / "kernel-store").rglob("*") if p.is_file())
        second = timed_up(sandbox, args.topology)
        second_lines = engine_lines(sandbox)
    finally:
        sandbox.destroy(echo=False)
        shutil.rmtree(workdir / "kernel-store", ignore_errors=True)
    print(f"{'bring-up':<34} {'to ready':>9} {'save done':>10} {'up total':>9}")
    for label, m in (("first (empty bucket, cold)", first), (f"second (after destroy, {kept} objects)", second)):
        print(f"{label:<34} {m.get('ready', float('nan')):8.1f}s {m.get('saved', float('nan')):9.1f}s "
              f"{m['total']:8.1f}s")
    print(f"time to ready: {first['ready']:.1f} s -> {second['ready']:.1f} s "
          f"({first['ready'] - second['ready']:.1f} s less)")
    for label, lines in (("first", first_lines), ("second", second_lines)):
        for line in lines:
            print(f"  {label}: {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
