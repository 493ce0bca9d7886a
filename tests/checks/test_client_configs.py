"""Tests of kimi_cluster/plan/client_configs.py: model ids and URLs match the endpoint, and the key is
only ever a reference to an environment variable.
"""

import json
from typing import Any

import pytest

from kimi_cluster.plan.client_configs import GET_KEY_COMMAND, build_client_configs

MODEL = "moonshotai/Kimi-K3.1-Pro"
URL = "http://203.0.113.7:8000"


@pytest.fixture
def configs():
    return build_client_configs(URL, MODEL, 131072)


def test_openai_block(configs):
    assert configs["openai"]["base_url"] == URL + "/v1"
    assert configs["openai"]["model"] == MODEL
    assert configs["openai"]["api_key_env"] == "KIMI_API_KEY"
    assert configs["api_key"]["how_to_get"] == GET_KEY_COMMAND == "pulumi stack output api_key --show-secrets"


def test_claude_code_env(configs):
    env = configs["claude_code"]["env"]
    assert env["ANTHROPIC_BASE_URL"] == URL  # the root: Claude Code appends /v1/messages itself
    assert env["ANTHROPIC_AUTH_TOKEN"] == "${KIMI_API_KEY}"
    assert env["API_TIMEOUT_MS"] == "3000000"
    for tier in ("OPUS", "SONNET", "HAIKU"):
        assert env[f"ANTHROPIC_DEFAULT_{tier}_MODEL"] == MODEL
    assert 'export ANTHROPIC_AUTH_TOKEN="${KIMI_API_KEY}"' in configs["claude_code"]["shell"]


def test_kimi_code_toml(configs):
    toml = configs["kimi_code"]["config_toml"]
    assert 'default_model = "hyperstack/kimi-k3.1-pro"' in toml
    assert f'base_url = "{URL}/v1"' in toml
    assert f'model = "{MODEL}"' in toml
    assert "max_context_size = 131072" in toml
    assert 'api_key = "${KIMI_API_KEY}"' in toml
    assert 'support_efforts = ["low", "high", "max"]' in toml


def test_openclaw_block(configs):
    block = json.loads(configs["openclaw"]["json"])
    assert block == configs["openclaw"]["provider_block"]
    provider = block["models"]["providers"]["sglang"]
    assert provider["baseUrl"] == URL + "/v1" and provider["apiKey"] == "${KIMI_API_KEY}"
    assert provider["api"] == "openai-completions"
    assert provider["models"][0]["id"] == MODEL and provider["models"][0]["contextWindow"] == 131072
    assert configs["openclaw"]["set_model"] == f"openclaw models set sglang/{MODEL}"
    vllm = build_client_configs(URL, MODEL, 1000, engine="vllm")["openclaw"]["provider_block"]
    assert list(vllm["models"]["providers"]) == ["vllm"]


@pytest.mark.parametrize("ref", ["$TEAM_KEY", "${TEAM_KEY}", "TEAM_KEY"])
def test_reference_spellings(ref):
    configs = build_client_configs(URL + "/v1/", MODEL, 4096, api_key_ref=ref)
    assert configs["api_key"]["env"] == "TEAM_KEY"
    assert configs["openai"]["base_url"] == URL + "/v1"
    assert "KIMI_API_KEY" not in json.dumps(configs)


def test_a_real_key_is_refused_not_inlined():
    for key in ("sk-4f2a9c0e1b7d", "3f9a0c1e2b4d6f8a"):
        with pytest.raises(ValueError, match="environment variable"):
            build_client_configs(URL, MODEL, 4096, api_key_ref=key)


def test_no_secret_material_in_any_value(configs):
    text = json.dumps(configs)
    assert "EMPTY" not in text and "Bearer sk" not in text
    # every place that carries a key carries the reference
    assert text.count("${KIMI_API_KEY}") >= 4


@pytest.mark.parametrize("bad", [dict(context_window=0), dict(context_window=True), dict(served_model_name=" "),
                                 dict(endpoint_url="203.0.113.7:8000"), dict(engine="tgi")])
def test_validation(bad):
    args: dict[str, Any] = dict(endpoint_url=URL, served_model_name=MODEL, context_window=4096)
    args.update(bad)
    with pytest.raises(ValueError):
        build_client_configs(**args)
