"""The kernel cache across `sandbox destroy` and `sandbox up`: the first bring-up compiles and saves, the next one
restores before the launch and the engine compiles nothing; a corrupt archive starts cold and the endpoint still
comes up. No secret of the node is in the bucket.
"""

from __future__ import annotations

import gzip
import json
import re
import socket

import pytest

from .conftest import COMPILING, engine_log, leftover_processes, ok, report

pytestmark = [pytest.mark.flow, pytest.mark.timeout(600)]


def bucket_bytes(workdir) -> bytes:
    """Everything the kept bucket holds, archives unpacked (gzip'd tar: its members' bytes are in the stream)."""
    data = b""
    for p in (workdir / "kernel-store").rglob("*"):
        if p.is_file():
            raw = p.read_bytes()
            data += gzip.decompress(raw) if p.name.endswith(".gz") else raw
    return data


def test_destroy_then_up_restores_the_kernels_and_a_corrupt_archive_starts_cold(sandbox) -> None:
    run = sandbox(env=COMPILING, kernel_cache=True)
    first = run("up", "--topology", "b300x1-vllm")
    ok(first)
    assert "starting cold: no archive for key" in run.step_output("kimi-node0-cache-restore")
    assert "compiling 6 of 6 kernels" in engine_log(run.workdir)
    assert re.search(r"saved 6 kernel files .* as key [0-9a-f]{32}", run.step_output("kimi-kernel-cache-save"))
    hf_token = (run.workdir / "secrets/hf_token").read_text().strip()
    # The key lives only in the head proxy's key file (the engine holds none).
    api_key = next(run.workdir.glob("nodes/*/etc/kimi-cluster/proxy/api-key")).read_text().strip()

    out = ok(run("destroy"))
    assert "kept the kernel-cache bucket's 2 objects" in out
    assert leftover_processes(run.workdir) == []
    kept = bucket_bytes(run.workdir)
    assert b"fake kernel" in kept and hf_token.encode() not in kept and api_key.encode() not in kept

    second = run("up", "--topology", "b300x1-vllm")
    ok(second)
    restore = run.step_output("kimi-node0-cache-restore")
    assert re.search(r"restored 6 kernel files .* for key [0-9a-f]{32}", restore), restore
    log = engine_log(run.workdir)
    assert "all 6 kernels found in the cache; no compile" in log and "compiling" not in log
    assert "nothing uploaded" in run.step_output("kimi-kernel-cache-save")
    ok(run("destroy"))

    archive = next((run.workdir / "kernel-store").rglob("cache.tar.gz"))
    raw = bytearray(archive.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    archive.write_bytes(bytes(raw))
    third = run("up", "--topology", "b300x1-vllm")
    out = ok(third)
    assert re.search(r"^  endpoint_url +https://10\.213\.\d+\.\d+:\d+$", out, re.M), out
    assert "starting cold: the archive is corrupt" in run.step_output("kimi-node0-cache-restore")
    assert "compiling 6 of 6 kernels" in engine_log(run.workdir)
    assert "saved 6 kernel files" in run.step_output("kimi-kernel-cache-save")  # a good one again
    ok(run("destroy"))
    assert leftover_processes(run.workdir) == []
    report(f"b300x1-vllm kernel cache: up cold {first.seconds:.1f} s, up restored {second.seconds:.1f} s, "
           f"up after a corrupt archive {third.seconds:.1f} s")


def test_an_unreachable_store_starts_cold_and_the_endpoint_still_comes_up(sandbox) -> None:
    run = sandbox(env=COMPILING, kernel_cache=True)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = sock.getsockname()[1]
    store = json.dumps({"bucket": "kimi-sandbox-kernels", "endpointUrl": f"http://127.0.0.1:{closed}",
                        "restoreTimeoutMinutes": 1, "saveTimeoutMinutes": 1})
    up = run("up", "--topology", "b300x1-vllm", "--config", f"kernelCache={store}")
    out = ok(up)
    assert re.search(r"^  endpoint_url +https://10\.213\.\d+\.\d+:\d+$", out, re.M), out
    restore = run.step_output("kimi-node0-cache-restore")
    assert f"starting cold: the store at s3://kimi-sandbox-kernels/kimi-cluster/kernel-cache/ at " \
           f"http://127.0.0.1:{closed} is unreachable" in restore, restore
    assert "compiling 6 of 6 kernels" in engine_log(run.workdir)
    assert "WARNING: not saved: the store at" in run.step_output("kimi-kernel-cache-save")
    ok(run("destroy"))
    assert leftover_processes(run.workdir) == []
    report(f"b300x1-vllm with an unreachable kernel-cache store: up {up.seconds:.1f} s (cold, endpoint up)")


def test_tokenspeeds_kernel_folders_travel_across_destroy_and_up(sandbox) -> None:
    run = sandbox(env=COMPILING, kernel_cache=True)
    image = ("--config", "image=lightseekorg/tokenspeed:0.1.1")
    first = run("up", "--topology", "b300x1-tokenspeed", *image)
    ok(first)
    # Triton x3, inductor, DeepGEMM, and TokenSpeed's autotune and MSA FMHA folders (kimi_cluster/plan/launch.py).
    assert "compiling 7 of 7 kernels" in engine_log(run.workdir)
    assert re.search(r"saved 7 kernel files .* as key [0-9a-f]{32}", run.step_output("kimi-kernel-cache-save"))
    ok(run("destroy"))
    second = run("up", "--topology", "b300x1-tokenspeed", *image)
    ok(second)
    assert re.search(r"restored 7 kernel files", run.step_output("kimi-node0-cache-restore"))
    assert "all 7 kernels found in the cache; no compile" in engine_log(run.workdir)
    ok(run("destroy"))
    assert leftover_processes(run.workdir) == []
    report(f"b300x1-tokenspeed kernel cache: up cold {first.seconds:.1f} s, up restored {second.seconds:.1f} s")
