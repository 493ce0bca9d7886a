"""The cache-restore and cache-save steps under real bash on fake nodes, against a signing-enforcing S3 store.

Every restore failure starts cold with one line saying why and exits 0; only kernel artifacts travel.
"""

from __future__ import annotations

import hashlib
import io
import json
import socket
import tarfile
import time

import pytest

from kimi_cluster.blueprint import render_step
from kimi_cluster.blueprint.inputs import engine_inputs
from kimi_cluster.plan import kernel_cache
from tests.kernel_cache.conftest import BUCKET
from tests.node.conftest import FAST, make_settings

pytestmark = pytest.mark.integration  # starts fake nodes, servers or outside tools

CREDS = "AKIDEXAMPLE:wJalrXUtnFEMIexample"  # well-formed: credentials without their ':' are refused

HF_TOKEN = "hf_canaryTokenThatMustStayOnTheNode"
API_KEY = "endpoint-canary-key-5d1c0e"


def settings_for(node, store, prefix: str, **extra):
    cache = {"bucket": BUCKET, "prefix": prefix, "endpointUrl": store.url if store else "http://127.0.0.1:9",
             "restoreTimeoutMinutes": 1, "saveTimeoutMinutes": 1}
    cache.update(extra.pop("cache", {}))
    return make_settings(extra.pop("topology", "h100x4-sglang"), nodeRoot=str(node.root),
                         kernelCache=json.dumps(cache), kernelCacheCredentials=CREDS, **extra)


def run_step(node, settings, step, credentials):
    script = render_step(settings, step, 0, "10.0.0.5", "10.0.0.5", FAST)
    assert not credentials or credentials.split(":")[-1] not in script
    result = node.run(script, stdin=credentials + "\n")
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout + result.stderr


def cache_dir(node, engine="sglang"):
    return node.root / "ephemeral/cache" / engine


def compiled(node, engine="sglang"):
    """What an engine leaves after its first start: kernels, and things that are not kernels."""
    c = cache_dir(node, engine)
    files = {
        "triton/5f3a/fused_moe_kernel.cubin": b"\x7fELF" + bytes(range(256)) * 40,
        "triton/5f3a/fused_moe_kernel.json": b'{"num_warps": 4}',
        "sglang/deep_gemm/cache/kernel.gemm_fp8.1a2b/kernel.cubin": b"\x7fELF deep gemm" * 100,
        "torchinductor/fxgraph/ab/graph.py": b"# compiled graph\n",
    }
    for rel, data in files.items():
        (c / rel).parent.mkdir(parents=True, exist_ok=True)
        (c / rel).write_bytes(data)
    return files


def plant_canaries(node, engine="sglang"):
    """Secrets where a careless pack would pick them up, inside and outside the kernel folders."""
    c = cache_dir(node, engine)
    planted = {
        "huggingface/token": HF_TOKEN,  # the HF token cache
        "huggingface/stored_tokens": f"[default]\nhf_token = {HF_TOKEN}\n",
        "engine.env": f"KIMI_API_KEY={API_KEY}\n",
        "triton/5f3a/.env": f"HF_TOKEN={HF_TOKEN}\n",
        "triton/5f3a/token": HF_TOKEN,
        "triton/cafe/autotune.json": json.dumps({"note": f"Authorization: Bearer {API_KEY}"}),  # a kernel's name
    }
    for rel, text in planted.items():
        (c / rel).parent.mkdir(parents=True, exist_ok=True)
        (c / rel).write_text(text)
    etc = node.root / "etc/kimi-cluster"
    etc.mkdir(parents=True, exist_ok=True, mode=0o700)
    (etc / "hf_token").write_text(HF_TOKEN + "\n")
    (etc / "engine.env").write_text(f"KIMI_API_KEY={API_KEY}\n")
    return planted


def stored_archive(store, settings):
    key = kernel_cache.cache_key(engine_inputs(settings)).id
    prefix = settings.kernel_cache.prefix
    s3 = store.client()
    manifest = json.loads(s3.get_object(Bucket=BUCKET, Key=f"{prefix}{key}/manifest.json")["Body"].read())
    data = s3.get_object(Bucket=BUCKET, Key=f"{prefix}{key}/cache.tar.gz")["Body"].read()
    return manifest, data


def files_under(path):
    return sorted(str(p.relative_to(path)) for p in path.rglob("*") if p.is_file()) if path.exists() else []


def test_save_then_restore_on_a_fresh_node_and_no_canary_travels(node_factory, store):
    first, second = node_factory(), node_factory()
    s1 = settings_for(first, store, "roundtrip")
    kernels = compiled(first)
    plant_canaries(first)

    out = run_step(first, s1, "cache-save", store.credentials)
    assert "saved 4 kernel files" in out, out
    assert "left out triton/5f3a/.env" in out and "left out triton/5f3a/token" in out
    assert "left out triton/cafe/autotune.json (holds a secret of this node)" in out
    manifest, data = stored_archive(store, s1)
    assert manifest["sha256"] == hashlib.sha256(data).hexdigest()
    assert manifest["fields"] == kernel_cache.cache_key(s1).fields
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        assert sorted(tar.getnames()) == sorted(kernels)
        raw = b"".join(tar.extractfile(m).read() for m in tar.getmembers())
    assert HF_TOKEN.encode() not in data + raw and API_KEY.encode() not in data + raw

    s2 = settings_for(second, store, "roundtrip")
    out = run_step(second, s2, "cache-restore", store.credentials)
    assert "restored 4 kernel files" in out, out
    assert files_under(cache_dir(second)) == sorted(kernels)
    for rel, content in kernels.items():
        assert (cache_dir(second) / rel).read_bytes() == content
    assert not any(HF_TOKEN in p.read_text(errors="replace") for p in cache_dir(second).rglob("*") if p.is_file())


def test_the_names_a_save_leaves_out_reach_the_output_escaped(node_factory, store):
    """Issue 34: the save's "left out NAME" lines printed names the engine chose, raw, into `pulumi up`'s output."""
    node = node_factory()
    settings = settings_for(node, store, "escaped")
    compiled(node)
    (cache_dir(node) / "triton/5f3a/token\x1b]0;pwned\x07").write_bytes(b"x")
    out = run_step(node, settings, "cache-save", store.credentials)
    assert "saved 4 kernel files" in out, out
    assert "\x1b" not in out and "\x07" not in out, out
    assert "left out triton/5f3a/token\\x1b]0;pwned\\x07 (a name kernels never have)" in out, out


def test_reruns_with_an_unchanged_key_download_and_upload_nothing(node_factory, store):
    first, second = node_factory(), node_factory()
    s1 = settings_for(first, store, "rerun")
    compiled(first)
    run_step(first, s1, "cache-save", store.credentials)
    before = store.client().head_object(Bucket=BUCKET, Key=f"rerun/{kernel_cache.cache_key(s1).id}/cache.tar.gz")
    assert "unchanged since this VM saved" in run_step(first, s1, "cache-save", store.credentials)

    s2 = settings_for(second, store, "rerun")
    assert "restored 4 kernel files" in run_step(second, s2, "cache-restore", store.credentials)
    assert "already restored for key" in run_step(second, s2, "cache-restore", store.credentials)
    # The restored node holds exactly what is stored: its save after the readiness wait uploads nothing either.
    assert "already holds these 4 kernel files; nothing uploaded" in run_step(second, s2, "cache-save",
                                                                             store.credentials)
    after = store.client().head_object(Bucket=BUCKET, Key=f"rerun/{kernel_cache.cache_key(s1).id}/cache.tar.gz")
    assert after["ETag"] == before["ETag"] and after["LastModified"] == before["LastModified"]


def test_a_changed_image_digest_or_tp_size_misses_and_the_same_configuration_hits(node_factory, store):
    saver = node_factory()
    base = dict(image="lmsysorg/sglang@sha256:" + "a" * 64)
    compiled(saver)
    run_step(saver, settings_for(saver, store, "keying", **base), "cache-save", store.credentials)

    other_image = node_factory()
    out = run_step(other_image, settings_for(other_image, store, "keying", image="lmsysorg/sglang@sha256:" + "b" * 64),
                   "cache-restore", store.credentials)
    assert "starting cold: no archive for key" in out, out
    assert files_under(cache_dir(other_image)) == []

    other_tp = node_factory()
    custom = dict(topology="custom", flavor="n3-H100x8-NVLink", nodeCount=4, gpusPerNode=8, gpuMemoryGb=80,
                  engine="sglang", gpuHourlyPriceUsd=2.6, **base)
    same_as_preset = settings_for(other_tp, store, "keying", **custom)
    assert kernel_cache.cache_key(same_as_preset).id == kernel_cache.cache_key(
        settings_for(saver, store, "keying", **base)).id
    bigger_gpu = settings_for(other_tp, store, "keying", **{**custom, "gpuMemoryGb": 141, "flavor": "n3-H200x8"})
    assert kernel_cache.cache_key(bigger_gpu).id != kernel_cache.cache_key(same_as_preset).id
    fewer = settings_for(other_tp, store, "keying", **{**custom, "nodeCount": 2, "gpuMemoryGb": 141,
                                                       "flavor": "n3-H200x8"})  # TP 16
    out = run_step(other_tp, fewer, "cache-restore", store.credentials)
    assert "starting cold: no archive for key" in out, out

    same = node_factory()
    out = run_step(same, settings_for(same, store, "keying", **base), "cache-restore", store.credentials)
    assert "restored 4 kernel files" in out, out


def test_a_corrupt_archive_starts_cold_with_a_warning(node_factory, store):
    saver, victim = node_factory(), node_factory()
    s = settings_for(saver, store, "corrupt")
    compiled(saver)
    run_step(saver, s, "cache-save", store.credentials)
    key = kernel_cache.cache_key(engine_inputs(s)).id
    _, data = stored_archive(store, s)
    flipped = bytearray(data)
    flipped[len(flipped) // 2] ^= 0xFF
    store.client().put_object(Bucket=BUCKET, Key=f"corrupt/{key}/cache.tar.gz", Body=bytes(flipped))

    out = run_step(victim, settings_for(victim, store, "corrupt"), "cache-restore", store.credentials)
    assert "kernel cache: starting cold: the archive is corrupt: its sha256 is" in out, out
    assert files_under(cache_dir(victim)) == []


def test_an_archive_saved_for_another_configuration_is_not_used(node_factory, store):
    node = node_factory()
    s = settings_for(node, store, "mismatch")
    key = kernel_cache.cache_key(engine_inputs(s))
    fields = {**key.fields, "image": "sha256:" + "c" * 64}
    body = b"not used"
    manifest = {"key": key.id, "fields": fields, "sha256": hashlib.sha256(body).hexdigest(), "size": len(body)}
    s3 = store.client()
    s3.put_object(Bucket=BUCKET, Key=f"mismatch/{key.id}/cache.tar.gz", Body=body)
    s3.put_object(Bucket=BUCKET, Key=f"mismatch/{key.id}/manifest.json", Body=json.dumps(manifest).encode())
    out = run_step(node, s, "cache-restore", store.credentials)
    assert "starting cold: the archive under key" in out and "saved for another configuration: image" in out, out


def test_an_archive_with_a_path_outside_the_kernel_caches_is_refused(node_factory, store):
    node = node_factory()
    s = settings_for(node, store, "unsafe")
    key = kernel_cache.cache_key(engine_inputs(s))
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in (("triton/ok.cubin", b"ok"), ("../../etc/kimi-cluster/engine.env", b"KIMI_API_KEY=x")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    body = buf.getvalue()
    manifest = {"key": key.id, "fields": key.fields, "sha256": hashlib.sha256(body).hexdigest(), "size": len(body)}
    s3 = store.client()
    s3.put_object(Bucket=BUCKET, Key=f"unsafe/{key.id}/cache.tar.gz", Body=body)
    s3.put_object(Bucket=BUCKET, Key=f"unsafe/{key.id}/manifest.json", Body=json.dumps(manifest).encode())
    out = run_step(node, s, "cache-restore", store.credentials)
    assert "starting cold: the archive holds '../../etc/kimi-cluster/engine.env'" in out, out
    assert files_under(cache_dir(node)) == []
    assert not (node.root / "etc/kimi-cluster/engine.env").exists()


def test_refused_credentials_start_cold_and_a_save_only_warns(node_factory, store):
    node = node_factory()
    s = settings_for(node, store, "refused")
    key_id = store.credentials.split(":")[0]
    out = run_step(node, s, "cache-restore", f"{key_id}:not-the-secret")
    assert "starting cold: the store refused the credentials (SignatureDoesNotMatch)" in out, out
    assert "kimi-cluster:kernelCacheCredentials" in out
    compiled(node)
    out = run_step(node, s, "cache-save", "AKIAUNKNOWN0000000000:bogus-secret-7f2e")
    assert "WARNING: not saved: the store refused the credentials (InvalidAccessKeyId)" in out, out


def test_an_unreachable_store_starts_cold_quickly(node_factory):
    node = node_factory()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = sock.getsockname()[1]
    s = settings_for(node, None, "gone", cache={"endpointUrl": f"http://127.0.0.1:{closed}"})
    started = time.monotonic()
    out = run_step(node, s, "cache-restore", "AKIAEXAMPLE:unreachable-secret-91ab")
    assert f"starting cold: the store at s3://{BUCKET}/gone/ at http://127.0.0.1:{closed} is unreachable" in out, out
    assert time.monotonic() - started < 60


@pytest.mark.parametrize("stdin", ["", "no-colon-here"])
def test_missing_or_malformed_credentials_start_cold(node_factory, store, stdin):
    node = node_factory()
    out = run_step(node, settings_for(node, store, "nocreds"), "cache-restore", stdin)
    assert "kernel cache: starting cold:" in out and "kimi-cluster:kernelCacheCredentials" in out, out


def test_kernels_already_on_a_node_stay_and_the_archive_is_added_beside_them(node_factory, store):
    saver, node = node_factory(), node_factory()
    compiled(saver)
    (cache_dir(saver) / "triton/beef/extra.cubin").parent.mkdir(parents=True)
    (cache_dir(saver) / "triton/beef/extra.cubin").write_bytes(b"from the archive")
    run_step(saver, settings_for(saver, store, "beside"), "cache-save", store.credentials)
    assert "compiled the kernels of key" in run_step(saver, settings_for(saver, store, "beside"),
                                                               "cache-restore", store.credentials)

    compiled(node)  # an earlier configuration's kernels, under the same names
    (cache_dir(node) / "triton/5f3a/fused_moe_kernel.json").write_bytes(b"this node's own")
    out = run_step(node, settings_for(node, store, "beside"), "cache-restore", store.credentials)
    assert "4 kernel files of an earlier configuration are here" in out and "restored 1 kernel files" in out, out
    assert (cache_dir(node) / "triton/5f3a/fused_moe_kernel.json").read_bytes() == b"this node's own"
    assert (cache_dir(node) / "triton/beef/extra.cubin").read_bytes() == b"from the archive"


def test_saving_an_empty_cache_only_warns(node_factory, store):
    node = node_factory()
    out = run_step(node, settings_for(node, store, "empty"), "cache-save", store.credentials)
    assert "WARNING: not saved:" in out and "holds no kernel files yet" in out, out
