"""Fixtures for the flows under the real Pulumi CLI: root for the fake nodes' namespaces, the toolchain built.

Outside CI a machine without them skips these flows with the reason; in CI (CI=true, as .ci/run runs) they fail,
since .ci/run installs everything they need.
"""

from __future__ import annotations

import json
import os
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from fakes.node_fabric import missing
from sandbox.pulumi_cli import TOOLCHAIN
from tests.sandbox.conftest import SandboxRunner, kill_everything

REAL = {"KIMI_SANDBOX_ENGINE": "pulumi"}


def _toolchain_ready() -> str | None:
    """Why the toolchain cannot be used without a build, or None (a warm `scripts/pulumi-toolchain` takes < 1 s)."""
    done = subprocess.run(["bash", str(TOOLCHAIN), "--check"], capture_output=True, text=True, timeout=60)
    return None if done.returncode == 0 else (done.stderr.strip().splitlines() or ["no toolchain"])[-1]


@pytest.fixture(scope="session")
def real_engine_ready() -> None:
    problems = missing()
    if not problems and (why := _toolchain_ready()):
        problems.append(why)
    if problems:
        message = "the real-engine flows need " + "; ".join(problems) + " (bash scripts/pulumi-toolchain builds it)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)


@pytest.fixture
def real_sandbox(tmp_path: Path, real_engine_ready: None) -> Iterator:
    """real_sandbox(env=None, timeline=False, kernel_cache=False) -> SandboxRunner under the real CLI."""
    made: list[SandboxRunner] = []

    def make(env: dict[str, str] | None = None, timeline: bool = False, kernel_cache: bool = False) -> SandboxRunner:
        runner = SandboxRunner(tmp_path / f"work{len(made)}", {**REAL, **(env or {})}, timeline, kernel_cache)
        made.append(runner)
        return runner

    yield make
    for runner in made:
        kill_everything(runner.workdir, runner.record())  # with the namespaces and bridge of a failed flow


def inventory(runner: SandboxRunner) -> dict:
    """The sandbox's own emulator's bookkeeping (it runs with --admin), as the test-only admin route gives it."""
    base = runner.record()["emulator_url"].removesuffix("/v1")
    with urllib.request.urlopen(f"{base}/_emulator/inventory", timeout=10) as answer:
        return json.loads(answer.read())


def vm_posts(runner: SandboxRunner) -> int:
    base = runner.record()["emulator_url"].removesuffix("/v1")
    with urllib.request.urlopen(f"{base}/_emulator/requests", timeout=10) as answer:
        requests = json.loads(answer.read())
    return sum(1 for r in requests if r["method"] == "POST" and r["path"] == "/core/virtual-machines")
