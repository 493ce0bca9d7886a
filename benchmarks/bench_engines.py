"""The sandbox's up, verify and destroy under its own engine and under the real Pulumi CLI, side by side in one run.

    python -m benchmarks.bench_engines [--topology h100x4-sglang] [--rounds 1] [--workdir .sandbox-engines]

Each round runs the whole flow once per engine, in turn (home, then pulumi), each in a fresh workdir, with the fake
engine compiling nothing and no kernel-cache bucket (`up --no-kernel-cache`), so the figures are the engines' own
cost plus the same node work. It prints each phase's wall time per engine, their ratio, and the medians over the
rounds. Under the real CLI the nodes are network namespaces with sshd (root only); under the home engine they are
directories.
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from sandbox.kimi import COMPILE_SECONDS_KNOB, ENGINES, EXIT_OK, TOPOLOGIES, Sandbox

PHASES = ("up", "verify", "destroy")


def _flow(engine: str, workdir: Path, topology: str) -> dict[str, float]:
    if workdir.exists():
        shutil.rmtree(workdir)
    out = io.StringIO()
    sandbox = Sandbox(workdir, out=out, engine=engine)
    times: dict[str, float] = {}
    for phase in PHASES:
        started = time.monotonic()
        if phase == "up":
            code = sandbox.up(topology, echo=False, timeline=False, kernel_cache=False)
        elif phase == "verify":
            code = sandbox.verify()
        else:
            code = sandbox.destroy(echo=False)
        times[phase] = time.monotonic() - started
        if code != EXIT_OK:
            sys.stdout.write(out.getvalue()[-4000:])
            if phase != "destroy":
                sandbox.destroy(echo=False)
            raise SystemExit(f"{engine}: sandbox {phase} failed (exit {code}); its log ends above")
    shutil.rmtree(workdir, ignore_errors=True)
    return times


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_engines", description=__doc__)
    parser.add_argument("--topology", choices=TOPOLOGIES[:3], default=TOPOLOGIES[0])
    parser.add_argument("--rounds", type=int, default=1, help="flows per engine, taken in turn (1-10)")
    parser.add_argument("--workdir", default=".sandbox-engines", help="parent of the flows' workdirs (made anew)")
    args = parser.parse_args(argv)
    if not 1 <= args.rounds <= 10:
        parser.error("--rounds must be 1 to 10")
    root = Path(args.workdir).resolve()
    if root.exists() and any(p.name not in ENGINES for p in root.iterdir()):
        parser.error(f"--workdir {root} holds files this benchmark did not make; give a new or empty directory")
    os.environ[COMPILE_SECONDS_KNOB] = "0"
    results: dict[str, list[dict[str, float]]] = {engine: [] for engine in ENGINES}
    for round_ in range(args.rounds):
        for engine in ("home", "pulumi"):
            times = _flow(engine, root / engine, args.topology)
            results[engine].append(times)
            print(f"round {round_ + 1}, {engine:6}: " + ", ".join(f"{p} {times[p]:5.1f} s" for p in PHASES),
                  flush=True)
    shutil.rmtree(root, ignore_errors=True)
    print(f"\n{args.topology}, medians of {args.rounds} round(s), wall seconds (this machine: {os.cpu_count()} CPUs)")
    print(f"  {'phase':8} {'sandbox engine':>15} {'Pulumi CLI':>11} {'CLI / engine':>13}")
    for phase in (*PHASES, "all"):
        def median(engine: str, phase: str = phase) -> float:
            return statistics.median(sum(t.values()) if phase == "all" else t[phase] for t in results[engine])
        home, real = median("home"), median("pulumi")
        print(f"  {phase:8} {home:15.1f} {real:11.1f} {real / home:13.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
