"""Shared fixtures for the node bring-up tests: settings per topology, fast timings, a fake node, a fake hub."""

from __future__ import annotations

from pathlib import Path

import pytest

from kimi_cluster.fakes.hub import FakeHub, Faults
from kimi_cluster.settings import Settings
from kimi_cluster.settings.loader import load_settings
from kimi_cluster.settings.timing import Timing

REPO = "moonshotai/Kimi-K3.1-Pro"
REVISION = "6d0a0202956796543364d666ab19c6ad1a494ee1"
BASE = {"operatorCidr": "203.0.113.7/32", "sshPublicKey": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIexample test"}
TOPOLOGIES = ("h100x4-sglang", "b300x1-vllm")
# Every wait is seconds long in the tests; the scripts are the same ones a real node runs.
FAST = Timing(poll_seconds=1, fast_poll_seconds=0.2, cloud_init_timeout_s=5, gpu_timeout_s=3, docker_timeout_s=5,
              pull_attempts=3, pull_timeout_s=10, pull_backoff_s=0, settle_seconds=0.3, download_timeout_s=60,
              readiness_timeout_s=30)


def make_settings(topology: str = "h100x4-sglang", **extra) -> Settings:
    return load_settings({**BASE, "topology": topology, **extra}, "dev")


@pytest.fixture
def hub():
    with FakeHub(REPO, REVISION) as h:
        yield h


def hub_with(**faults) -> FakeHub:
    token = faults.pop("token", None)
    return FakeHub(REPO, REVISION, token=token, faults=Faults(**faults))


def chmod_spy(tmp_path: Path, container: str) -> tuple[Path, Path]:
    """A `chmod` to put first on PATH: before running the real one it records in the returned file which containers
    named `container` run (their ids, one a line) and then `chmod`. (the folder to prepend, the record)"""
    spy = tmp_path / "spy"
    spy.mkdir()
    seen = tmp_path / "running-at-chmod"
    (spy / "chmod").write_text(f'#!/bin/bash\ndocker ps -q --filter name=^{container}$ --filter status=running '
                               f'>> {seen}\necho chmod >> {seen}\nexec /bin/chmod "$@"\n')
    (spy / "chmod").chmod(0o755)
    return spy, seen
