"""kimi_cluster/node/check_download.py against the fake hub: a complete snapshot passes; each kind of damage is
named."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from huggingface_hub import snapshot_download

from kimi_cluster.node import check_download
from tests.node.conftest import REPO, REVISION, hub_with

pytestmark = pytest.mark.integration  # starts fake nodes, servers or outside tools

SHARD2 = "model-00002-of-00003.safetensors"


@pytest.fixture(scope="module")
def served():
    with hub_with(private=True, token="hf_check_token") as hub:
        yield hub


@pytest.fixture
def snapshot(served, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    cache = tmp_path / "hub"
    path = snapshot_download(REPO, revision=REVISION, cache_dir=cache, endpoint=served.url, token="hf_check_token")
    token_file = tmp_path / "token"
    token_file.write_text("hf_check_token\n")
    return Path(path), cache, token_file


def run(served, cache, token_file, *extra):
    return check_download.main(["--repo", REPO, "--revision", REVISION, "--cache-dir", str(cache),
                                "--endpoint", served.url, "--token-file", str(token_file), "--progress-seconds", "0.05",
                                *extra])


def test_complete_snapshot_passes_with_and_without_hashing(served, snapshot, capsys):
    _, cache, token = snapshot
    assert run(served, cache, token) == 0
    assert run(served, cache, token, "--sha256") == 0
    out = capsys.readouterr().out
    assert "RESULT: COMPLETE" in out and "safetensors      : 3/3" in out and "files            : 5/5" in out


def test_a_missing_shard_is_named(served, snapshot, capsys):
    snap, cache, token = snapshot
    os.unlink(os.path.realpath(snap / SHARD2))  # the blob goes; the snapshot link dangles
    assert run(served, cache, token) == 1
    out = capsys.readouterr().out
    assert f"MISSING    {SHARD2}" in out and "safetensors      : 2/3" in out and "RESULT: INCOMPLETE" in out


def test_a_truncated_shard_is_named_with_its_sizes(served, snapshot, capsys):
    snap, cache, token = snapshot
    blob = os.path.realpath(snap / SHARD2)
    size = os.path.getsize(blob)
    os.truncate(blob, 100)
    assert run(served, cache, token) == 1
    assert f"SHORT      {SHARD2}: 100 of {size:,} bytes" in capsys.readouterr().out


def test_a_corrupt_shard_passes_the_size_check_but_not_sha256(served, snapshot, capsys):
    snap, cache, token = snapshot
    blob = os.path.realpath(snap / SHARD2)
    with open(blob, "r+b") as fh:
        fh.seek(200)
        fh.write(b"\xff\xff\xff\xff")
    assert run(served, cache, token) == 0  # same size: only hashing can tell
    assert run(served, cache, token, "--sha256") == 1
    out = capsys.readouterr().out
    assert f"CORRUPT    {SHARD2}: sha256" in out
    assert "CORRUPT    model-00001" not in out


def test_a_corrupt_small_file_is_caught_by_its_git_hash(served, snapshot, capsys):
    snap, cache, token = snapshot
    blob = os.path.realpath(snap / "config.json")
    text = Path(blob).read_text()
    Path(blob).write_text(text.replace("kimi_k3", "kimi_k4"))
    assert run(served, cache, token, "--sha256") == 1
    assert "CORRUPT    config.json: git blob" in capsys.readouterr().out


def test_incomplete_leftovers_fail_the_check(served, snapshot, capsys):
    snap, cache, token = snapshot
    leftover = Path(os.path.realpath(snap / SHARD2)).parent / "abc123.deadbeef.incomplete"
    leftover.write_bytes(b"partial")
    assert run(served, cache, token) == 1
    out = capsys.readouterr().out
    assert "PARTIAL    blobs/abc123.deadbeef.incomplete" in out and ".incomplete files: 1" in out


def test_no_snapshot_at_all(served, tmp_path, capsys):
    token = tmp_path / "token"
    token.write_text("hf_check_token")
    assert run(served, tmp_path / "empty", token) == 1
    assert "MISSING    the snapshot directory" in capsys.readouterr().out


def test_a_hub_that_refuses_us_is_an_error_not_a_pass(served, snapshot, capsys):
    _, cache, _ = snapshot
    assert run(served, cache, Path("/nonexistent-token")) == 2
    assert "cannot read the hub's manifest" in capsys.readouterr().out


def test_it_runs_standalone_with_only_huggingface_hub(served, snapshot):
    _, cache, token = snapshot
    script = Path(check_download.__file__)
    r = subprocess.run([sys.executable, "-I", str(script), "--repo", REPO, "--revision", REVISION,
                        "--cache-dir", str(cache), "--token-file", str(token), "--sha256"],
                       capture_output=True, text=True, env={**os.environ, "HF_ENDPOINT": served.url}, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "RESULT: COMPLETE" in r.stdout
