"""Fixtures for the kernel-cache tests: one signing-enforcing S3 store (moto's server mode) per module."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kimi_cluster.fakes.s3_store import S3Store
from kimi_cluster.fakes.sandbox_services import free_port

REPO_ROOT = Path(__file__).resolve().parents[2]
BUCKET = "kimi-test-kernels"


class _Proc:
    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc = proc

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def start_store(tmp: Path, bucket: str = BUCKET) -> S3Store:
    """`python -m kimi_cluster.fakes.s3_store` in its own process (moto's auth setting is per process), as the sandbox
    runs it."""
    creds = tmp / "s3-credentials"
    log = open(tmp / "s3.log", "w")
    port_file = tmp / "s3.port"
    port = free_port()  # below the ephemeral range: no other test's bind(port 0) takes it before the store binds
    port_file.write_text(str(port))
    proc = subprocess.Popen([sys.executable, "-m", "kimi_cluster.fakes.s3_store", "--port", str(port), "--bucket",
                             bucket,
                             "--credentials-file", str(creds)], cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    deadline = time.monotonic() + 60
    while not creds.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"the S3 store did not start: {(tmp / 's3.log').read_text()}")
        time.sleep(0.1)
    return S3Store(f"http://127.0.0.1:{port}", bucket, creds.read_text().strip(), _Proc(proc))


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    s = start_store(tmp_path_factory.mktemp("s3"))
    yield s
    s.stop()

