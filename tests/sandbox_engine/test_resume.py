"""A killed `up` leaves a state the next `up` resumes from, and `destroy` cleans up after a partial `up`."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from sandbox.engine import _settings, run_destroy, run_up, spawn

from .conftest import ops, state, state_names

pytestmark = pytest.mark.timeout(60)


def processes_in(directory: Path) -> list[int]:
    """Pids of processes whose working directory is `directory` (the node command and its children)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.readlink(f"/proc/{entry}/cwd") == str(directory):
                    found.append(int(entry))
            except OSError:
                continue
    return found


def kill_when_slow_command_runs(project: Path, workdir: Path, toy_dir: Path, how: str = "group") -> str:
    """Start `up`, wait until the slow node command runs (r1, r2 done), then kill the engine.

    how="group": SIGKILL to the engine's process group, like a lost machine. how="sigterm": SIGTERM to the engine
    alone, which must stop the commands it started itself.
    """
    settings = _settings(project_dir=project, stack="dev", workdir=workdir, config_overrides={"toyDir": str(toy_dir)},
                         operation_timeout=600.0, deadline=600.0)
    proc = spawn("up", settings)
    started = workdir / "nodes" / "h1" / "started"
    deadline = time.monotonic() + 30
    try:
        while not started.exists():
            assert proc.poll() is None, "the engine exited before the slow command started"
            assert time.monotonic() < deadline, "the slow command did not start within 30s"
            time.sleep(0.05)
    finally:
        if how == "sigterm":
            os.kill(proc.pid, signal.SIGTERM)
        else:
            os.killpg(proc.pid, signal.SIGKILL)
        code = proc.wait(timeout=10)
    assert code == (-signal.SIGKILL if how == "group" else 128 + signal.SIGTERM)
    assert processes_in(workdir / "nodes" / "h1") == [] or _settle(workdir / "nodes" / "h1")
    assert proc.stdout is not None
    return proc.stdout.read()


def _settle(directory: Path) -> bool:
    # Killed processes may take a moment to be reaped.
    deadline = time.monotonic() + 5
    while processes_in(directory):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.mark.parametrize("how", ["group", "sigterm"])
def test_killed_up_resumes_without_creating_anything_twice(
    make_project, tmp_path: Path, toy_dir: Path, how: str
) -> None:
    project, workdir = make_project("slow"), tmp_path / "work"
    kill_when_slow_command_runs(project, workdir, toy_dir, how)
    assert state_names(workdir) == ["slow-dev", "r1", "r2"]
    assert [p["op"] for p in state(workdir)["pending_operations"]] == ["create"]
    assert not (workdir / "nodes" / "h1" / "finished").exists()

    result = run_up(project, "dev", workdir, {"toyDir": str(toy_dir), "sleep": "0"}, echo=False)
    assert "interrupted during create of command:remote:Command 'slow'" in result.log
    assert ops(toy_dir, "create") == ["r1", "r2", "r3"]
    assert result.counts["create"] == 2  # the slow command and r3
    assert result.outputs["third_path"] == str(toy_dir / "files" / "r3")
    assert (workdir / "nodes" / "h1" / "finished").exists()
    assert state(workdir)["pending_operations"] == []

    run_destroy(project, "dev", workdir, echo=False)
    assert list((toy_dir / "files").iterdir()) == []
    assert state(workdir)["resources"] == []


def test_destroy_after_a_killed_up_cleans_everything(make_project, tmp_path: Path, toy_dir: Path) -> None:
    project, workdir = make_project("slow"), tmp_path / "work"
    kill_when_slow_command_runs(project, workdir, toy_dir)
    result = run_destroy(project, "dev", workdir, echo=False)
    assert ops(toy_dir, "delete") == ["r2", "r1"]
    assert list((toy_dir / "files").iterdir()) == []
    assert state(workdir)["resources"] == []
    assert state(workdir)["pending_operations"] == []
    assert "interrupted during create" in result.log
