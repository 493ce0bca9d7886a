"""Sandbox `up` of a 4-node and an 8-node cluster, measured side by side in one run: what the host's 4-call limit costs.

    python -m benchmarks.bench_sandbox [--build-seconds 0.3 5] [--workdir .sandbox-bench]

Pulumi's dynamic provider host serves at most 4 calls at once, and a VM's create holds one of them until the VM is
ACTIVE with its address: with more than 4 VMs, the 5th create starts only when one of the first 4 is done. For each
emulated boot time (`--build-seconds`: how long a VM stays in BUILD), it deploys h100x4-sglang (4 nodes) and a
custom 8-node cluster (8 x 4 H100, the same 32 GPUs) with the sandbox, prints the wall time of each `up`, the
longest single VM create and the time until the last VM was up, then destroys both. A 6-node cluster cannot be
measured: the sizing guard refuses it for this model (tensor parallel 6 x GPUs never divides 96 heads and 7168).
"""

from __future__ import annotations

import argparse
import io
import os
import re
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from benchmarks._args import interrupt_on_sigterm, number_problem
from kimi_cluster.sandbox.kimi import EXIT_OK, Sandbox
from kimi_cluster.sandbox.services import EMULATOR_ARGS_VARIABLE

CASES: dict[str, tuple[str, dict[str, str]]] = {
    "4 nodes (h100x4-sglang)": ("h100x4-sglang", {}),
    "8 nodes (custom 8 x 4 H100)": ("custom", {"flavor": "n3-H100x8-NVLink", "nodeCount": "8", "gpusPerNode": "4",
                                                "gpuMemoryGb": "80", "engine": "sglang"}),
}
_VM_CREATED = re.compile(r"VirtualMachine \S+ created \(([\d.]+)s\)")
def _measure(workdir: Path, topology: str, config: dict[str, str]) -> dict[str, float]:
    out = io.StringIO()
    sandbox = Sandbox(workdir, out=out)
    started = time.monotonic()
    try:
        code = sandbox.up(topology, echo=True, config=config)
    except BaseException:  # Ctrl-C, SIGTERM (interrupt_on_sigterm), a crash: nothing is left running
        sandbox.destroy(echo=False)
        raise
    up_s = time.monotonic() - started
    log = out.getvalue()
    if code != EXIT_OK:
        sys.stdout.write(log[-4000:])
        sandbox.destroy(echo=False)  # a failed measurement leaves nothing running
        raise SystemExit(f"sandbox up of {topology} failed (exit {code}); its log ends above")
    creates = [float(m) for m in _VM_CREATED.findall(log)]
    sandbox.out = io.StringIO()
    if sandbox.destroy(echo=False) != EXIT_OK:
        raise SystemExit(f"sandbox destroy of {workdir} failed: {sandbox.out.getvalue()[-2000:]}")
    return {"up": up_s, "vms": len(creates), "longest_create": max(creates, default=0.0)}


# An emulated VM boot past ten minutes measures nothing the shorter ones do not.
MAX_BUILD_SECONDS = 600.0
_SCRATCH = re.compile(r"logs|b[0-9.e+-]+-[0-9]+")


def _usage_problem(build_seconds: Sequence[float], root: Path) -> str | None:
    for value in build_seconds:
        problem = number_problem("--build-seconds", value, 0, MAX_BUILD_SECONDS, low_open=False)
        if problem:
            return problem
    if root.exists() and not root.is_dir():
        return f"--workdir {root} is a file; give a directory (it is created, and removed afterwards)"
    # The workdir is removed afterwards: only one this benchmark made (its logs and b<seconds>-<case> folders).
    foreign = [p.name for p in root.iterdir() if not _SCRATCH.fullmatch(p.name)] if root.is_dir() else []
    if foreign:
        return (f"--workdir {root} holds {', '.join(sorted(foreign)[:3])}, which this benchmark did not make and "
                "would remove afterwards; give a new or empty directory")
    return None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_sandbox", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build-seconds", type=float, nargs="+", default=[0.3, 5.0],
                        help="emulated VM boot times (seconds in BUILD) to measure with")
    parser.add_argument("--workdir", default=".sandbox-bench", help="scratch directory, removed afterwards")
    args = parser.parse_args(argv)
    root = Path(args.workdir).resolve()
    problem = _usage_problem(args.build_seconds, root)
    if problem:  # before the emulator starts
        print(f"error: {problem}", file=sys.stderr)
        return 2
    interrupt_on_sigterm()  # a `timeout` or a closed terminal still destroys the sandbox
    rows = []
    for build in args.build_seconds:
        # The sandbox's own emulator, with this boot time (its last --build-seconds wins): under the real CLI the
        # sandbox never talks to another emulator.
        os.environ[EMULATOR_ARGS_VARIABLE] = f"--build-seconds {build:g}"
        for i, (label, (topology, config)) in enumerate(CASES.items()):
            print(f"measuring {label} with a {build:g} s VM boot ...", flush=True)
            rows.append((build, label, _measure(root / f"b{build:g}-{i}", topology, config)))
    shutil.rmtree(root, ignore_errors=True)
    print(f"\n{'VM boot':>8}  {'cluster':<28} {'up (s)':>7} {'VMs':>4} {'longest VM create (s)':>22}")
    for build, label, m in rows:
        print(f"{build:>7g}s  {label:<28} {m['up']:>7.1f} {m['vms']:>4.0f} {m['longest_create']:>22.1f}")
    print("(one run, this machine; a VM create holds one of the provider host's 4 call slots until the VM is up)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
