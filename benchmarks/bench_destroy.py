"""`preview`, `up` and `destroy` of the 4-node sandbox before and after the rules went `deletedWith` their VM (and
the stateless providers' code stopped being a secret), side by side in one run.

    python -m benchmarks.bench_destroy [--workdir .sandbox-bench-destroy] [--rounds 1]

"Before" is the previous release (kimi_cluster/sandbox/releases.py: a git worktree of its commit with its own
virtualenv, whose own sandbox door brings the stack up), "after" this checkout. For each it times the `sandbox up` of
h100x4-sglang (without the kernel cache), then on the deployed stack a `pulumi preview` with nothing to change and
the `pulumi destroy` itself (both the real CLI, on the same workdir), and counts the destroy's DELETE calls in the
emulator's own request log: with `deletedWith`, one per VM, keypair and environment and none per rule. Then the
sandbox's own destroy stops the services and removes the workdir.
"""

from __future__ import annotations

import argparse
import io
import json
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks._args import number_problem, workdir_problem
from kimi_cluster.sandbox import releases
from kimi_cluster.sandbox.cli_stacks import CliStacks


def _requests(workdir: Path) -> list[dict[str, Any]]:
    url = json.loads((workdir / "sandbox.json").read_text())["emulator_url"].removesuffix("/v1")
    with urllib.request.urlopen(f"{url}/_emulator/requests", timeout=10) as answer:
        return list(json.loads(answer.read()))


def measure(checkout: Path, workdir: Path) -> dict[str, Any]:
    """One side: up (the checkout's own sandbox), a no-change preview and the destroy (the CLI), its DELETE calls."""
    from kimi_cluster.sandbox.nodes import COMPILE_SECONDS_KNOB

    env = {COMPILE_SECONDS_KNOB: "0"}
    started = time.monotonic()
    up = releases.sandbox_command(checkout, workdir, "up", "--topology", "h100x4-sglang", "--no-timeline",
                                  "--no-kernel-cache", "--quiet", env=env)
    up_s = time.monotonic() - started
    if up.returncode != 0:
        raise RuntimeError(f"up with {checkout} failed: {up.stdout[-2000:]}")
    stacks = CliStacks(workdir, workdir / "secrets", io.StringIO())
    cli, stack = stacks.cli(), stacks.cluster
    rules = sum(1 for r in stacks.resources(stack) if r.get("type", "").endswith("hyperstack:SecurityRule"))
    started = time.monotonic()
    cli.run(["preview", "--stack", stack.name], cwd=stack.project_dir, timeout=600)
    preview_s = time.monotonic() - started
    before = len(_requests(workdir))
    started = time.monotonic()
    cli.run(["destroy", "--yes", "--stack", stack.name], cwd=stack.project_dir, timeout=900)
    destroy_s = time.monotonic() - started
    calls = [r for r in _requests(workdir)[before:] if r["method"] == "DELETE"]
    done = releases.sandbox_command(checkout, workdir, "destroy", "--quiet", env=env)
    if done.returncode != 0:
        raise RuntimeError(f"destroy with {checkout} failed: {done.stdout[-2000:]}")
    return {"up_s": up_s, "preview_s": preview_s, "destroy_s": destroy_s, "rules": rules,
            "delete_calls": len(calls), "rule_deletes": sum(1 for r in calls if "/sg-rules/" in r["path"])}


def release_problem(release: str) -> str | None:
    """Why --release names no commit of this clone, before the minutes of a worktree and its virtualenv."""
    try:
        done = subprocess.run(["git", "rev-parse", "--verify", "--quiet", "--end-of-options",
                               f"{release}^{{commit}}"], cwd=releases.REPO_ROOT, capture_output=True, text=True,
                              timeout=60)
    except OSError as err:
        return f"--release {release!r}: the release's checkout needs git ({err.strerror or err})"
    if done.returncode == 0:
        return None
    return (f"--release {release!r} names no commit of this clone: give a commit's hash, a tag or a branch "
            f"(git log --oneline); the default, {releases.PREVIOUS_RELEASE}, is the previous release's, and "
            "docs/CHANGELOG.md names each release's commit (a shallow clone lacks them: git fetch --unshallow)")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_destroy", description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, default=Path(".sandbox-bench-destroy"))
    parser.add_argument("--rounds", type=int, default=1, help="before and after, this many times each (1 to 5)")
    parser.add_argument("--release", default=releases.PREVIOUS_RELEASE, help="the commit of 'before'")
    args = parser.parse_args(argv)
    problems = [p for p in (number_problem("--rounds", args.rounds, 1, 5, low_open=False),
                            workdir_problem(args.workdir), release_problem(args.release)) if p]
    if problems:
        print(f"error: {problems[0]}", file=sys.stderr)
        return 2
    print(f"preparing the release {args.release} (a worktree and its venv, once) ...", flush=True)
    try:
        before = releases.release_checkout(args.release)
    except releases.ReleaseError as err:  # its worktree or virtualenv could not be made: the message says which
        print(f"error: --release {args.release}: {err}", file=sys.stderr)
        return 1
    sides = {f"before ({args.release})": before, "after (this checkout)": releases.REPO_ROOT}
    figures: dict[str, list[dict[str, Any]]] = {name: [] for name in sides}
    for round_ in range(args.rounds):
        for name, checkout in sides.items():
            workdir = args.workdir.resolve() / f"{round_}-{name.split()[0]}"
            figures[name].append(measure(checkout, workdir))
            shutil.rmtree(workdir, ignore_errors=True)
            print(f"  round {round_ + 1}, {name}: {json.dumps(figures[name][-1])}", flush=True)
    print(f"\n4-node sandbox (h100x4-sglang), real Pulumi CLI; best of {args.rounds} round(s), the slowest in brackets")
    print(f"{'':24}{'up s':>14}{'preview s':>14}{'destroy s':>14}{'DELETEs':>9}{'rule DELETEs':>14}")
    for name, rows in figures.items():
        best = {k: min(r[k] for r in rows) for k in rows[0]}
        worst = {k: max(r[k] for r in rows) for k in rows[0]}
        times = "".join(f"{best[k]:7.1f} ({worst[k]:4.1f})" for k in ("up_s", "preview_s", "destroy_s"))
        print(f"{name:24}{times}{best['delete_calls']:9d}{best['rule_deletes']:14d} (of {best['rules']} rules)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
