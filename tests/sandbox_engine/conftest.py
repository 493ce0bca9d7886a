"""Fixtures for the sandbox engine tests: toy projects copied into a temp dir, a toy directory, stub node tools."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

PROGRAMS = Path(__file__).parent / "programs"


@pytest.fixture
def toy_dir(tmp_path: Path) -> Path:
    """Where the toy providers write their files and calls.log."""
    path = tmp_path / "toy"
    path.mkdir()
    return path


@pytest.fixture
def make_project(tmp_path: Path):
    """Copy programs/<name> plus the shared toyprov.py into a fresh project directory."""

    def make(name: str) -> Path:
        project = tmp_path / name
        shutil.copytree(PROGRAMS / name, project)
        shutil.copy(PROGRAMS / "toyprov.py", project / "toyprov.py")
        return project

    return make


@pytest.fixture
def stubs(tmp_path: Path) -> Path:
    """Stand-ins for node tools, put first on PATH of node commands."""
    path = tmp_path / "stubs"
    path.mkdir()
    stub = path / "nvidia-smi"
    stub.write_text("#!/bin/sh\necho stub-gpu\n")
    stub.chmod(0o755)
    return path


def calls(toy_dir: Path) -> list[dict[str, Any]]:
    """The toy providers' call log: one dict per call (op, name, phase, pid, t)."""
    log = toy_dir / "calls.log"
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines()]


def ops(toy_dir: Path, op: str, phase: str = "start") -> list[str]:
    """Names the toy providers performed `op` on, in order."""
    return [c["name"] for c in calls(toy_dir) if c["op"] == op and c["phase"] == phase]


def state(workdir: Path) -> dict[str, Any]:
    return json.loads((workdir / "state.json").read_text())


def state_names(workdir: Path) -> list[str]:
    return [r["name"] for r in state(workdir)["resources"]]
