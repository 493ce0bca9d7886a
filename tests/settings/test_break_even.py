"""The cluster against the API: the break-even rate in the plan and the cost per token in status, on known values."""

from __future__ import annotations

import json

import pytest

from kimi_cluster.blueprint import pricing
from kimi_cluster.cli import plan
from kimi_cluster.settings import SettingsError, catalog
from kimi_cluster.settings.loader import load_settings

API = catalog.ApiPrice("test API", 2.00, 10.00, "a test", "2026-11-10")
BASE = {"operatorCidr": "203.0.113.7/32", "sshPublicKey": "ssh-ed25519 AAAAC3Nza test"}


def test_output_only_the_break_even_is_the_hourly_cost_over_the_output_price():
    point = pricing.break_even(60.0, API, catalog.TokenMix(0, "none"))
    assert point is not None
    assert point.api_usd_per_m_output == 10.0
    assert point.output_tokens_per_hour == pytest.approx(6_000_000)
    assert point.output_tokens_per_second == pytest.approx(6_000_000 / 3600)
    assert point.input_tokens_per_hour == 0


def test_input_tokens_raise_the_apis_bill_per_output_token_and_lower_the_break_even():
    point = pricing.break_even(60.0, API, catalog.TokenMix(20, "twenty"))
    assert point is not None
    assert point.api_usd_per_m_output == 50.0  # 20 x $2 + $10
    assert point.output_tokens_per_hour == pytest.approx(1_200_000)
    assert point.input_tokens_per_hour == pytest.approx(24_000_000)
    # at that rate the API's bill for one hour is the cluster's hour
    assert pricing.api_usd(API, point.input_tokens_per_hour, point.output_tokens_per_hour) == pytest.approx(60.0)


def test_no_hourly_cost_no_break_even():
    assert pricing.break_even(None, API, catalog.AGENTIC_CODING_MIX) is None


def test_the_default_mix_is_the_traces_ratio():
    assert catalog.AGENTIC_CODING_MIX.input_per_output == pytest.approx(293.7)
    assert "tracelab.cs.washington.edu" in catalog.AGENTIC_CODING_MIX.source


def test_zero_tokens_served_has_no_cost_per_token_and_says_what_was_spent():
    cost = pricing.token_cost(83.2, 0, 0, API)
    assert cost.usd_per_m_output is None and cost.api_usd_per_m_output is None
    assert cost.api_usd_same_tokens == 0
    assert "$83.20 spent and no output token yet" in cost.summary()
    assert cost.to_json()["usd_per_m_output"] is None


def test_missing_counters_count_as_zero():
    cost = pricing.token_cost(1.0, None, None, API)
    assert (cost.input_tokens, cost.output_tokens) == (0, 0)


def test_cost_per_token_so_far_and_the_apis_price_for_the_same_tokens():
    cost = pricing.token_cost(10.0, 20_000_000, 1_000_000, API)
    assert cost.usd_per_m_output == pytest.approx(10.0)
    assert cost.api_usd_same_tokens == pytest.approx(50.0)  # 20 x $2 + 1 x $10
    assert cost.api_usd_per_m_output == pytest.approx(50.0)
    assert "$10.00 per 1M output tokens so far" in cost.summary()


def test_a_fresh_cluster_is_honest_about_being_expensive():
    # an hour of a 4-node cluster, a handful of test requests: thousands of dollars per 1M output tokens
    cost = pricing.token_cost(83.2, 5_000, 2_000, API)
    assert cost.usd_per_m_output == pytest.approx(41_600.0)
    assert cost.api_usd_same_tokens == pytest.approx(0.03)


def test_spend_unknown_without_the_vms_creation_times():
    cost = pricing.token_cost(None, 10, 10, API)
    assert cost.usd_per_m_output is None
    assert "HYPERSTACK_API_KEY" in cost.summary()


def test_api_prices_and_the_mix_can_be_overridden_in_config():
    s = load_settings({**BASE, "apiInputPriceUsdPerM": "0.5", "inputTokensPerOutputToken": "4"}, "dev")
    assert (s.api_price.usd_per_m_input, s.api_price.usd_per_m_output) == (0.5, 10.0)
    assert "apiInputPriceUsdPerM" in s.api_price.source
    assert s.token_mix.input_per_output == 4
    default = load_settings(BASE, "dev")
    assert default.api_price is catalog.MOONSHOT_API_PRICE and default.token_mix is catalog.AGENTIC_CODING_MIX


@pytest.mark.parametrize("key,value", [("apiOutputPriceUsdPerM", "0"), ("apiInputPriceUsdPerM", "-1"),
                                       ("inputTokensPerOutputToken", "nan"), ("apiOutputPriceUsdPerM", "inf")])
def test_bad_prices_are_refused_naming_the_key(key, value):
    with pytest.raises(SettingsError, match=f"kimi-cluster:{key}"):
        load_settings({**BASE, key: value}, "dev")


def test_the_plan_prints_the_break_even_with_the_apis_date_and_source(capsys, monkeypatch):
    monkeypatch.delenv("HYPERSTACK_API_KEY", raising=False)  # the catalog price, not a live one
    assert plan.main(["--stack", "dev"]) == 0
    out = capsys.readouterr().out
    assert "Break-even   139,270 output tokens per hour sustained (38.7/s)" in out
    assert "$2.00 per 1M input and $10.00 per 1M output tokens" in out and "as of 2026-11-10" in out
    assert "293.7 input tokens per output token" in out


def test_the_json_plan_carries_the_break_even(capsys, tmp_path, monkeypatch):
    monkeypatch.delenv("HYPERSTACK_API_KEY", raising=False)
    cfg = tmp_path / "Pulumi.x.yaml"
    cfg.write_text("config:\n  kimi-cluster:operatorCidr: 203.0.113.7/32\n  kimi-cluster:sshPublicKey: "
                   "ssh-ed25519 AAAAC3Nza test\n  kimi-cluster:topology: b300x1-vllm\n"
                   "  kimi-cluster:inputTokensPerOutputToken: 0\n")
    assert plan.main(["--config", str(cfg), "--json"]) == 0
    b = json.loads(capsys.readouterr().out)["break_even"]
    assert b["output_tokens_per_hour"] == 5_920_000  # $59.20 / $10 per 1M
    assert b["api"]["as_of"] == "2026-11-10"
