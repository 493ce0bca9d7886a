"""The sizing guard reproduces the published sizing table (which shapes fit the 1,561 GB checkpoint; 8x B200 is
about 25 GB short) and the H100 arithmetic (32 x 79.19 GiB against 1,454 GiB of weights)."""

import pytest

from kimi_cluster.settings import catalog, sizing
from kimi_cluster.settings.catalog import GB, GIB

MODEL = catalog.KIMI_K31_PRO


def fit(gpu: str, nodes: int, per_node: int = 8, tp: int | None = None) -> sizing.FitReport:
    return sizing.check_fit(MODEL, catalog.GPUS[gpu], nodes, per_node, tp or nodes * per_node)


def test_valid_tp_sizes_divide_heads_and_hidden():
    assert sizing.valid_tp_sizes(MODEL) == [1, 2, 4, 8, 16, 32]
    for tp in sizing.valid_tp_sizes(MODEL):
        assert MODEL.attention_heads % tp == 0 and MODEL.hidden_size % tp == 0


def test_b300_single_node_fits_with_about_743_gb():
    r = fit("B300-288G", 1)
    assert r.fits
    assert r.headroom_bytes / GB == pytest.approx(742.7, abs=0.5)


def test_b200_single_node_is_about_25_gb_short():
    r = fit("B200-192G", 1)
    assert not r.fits
    assert r.capacity_bytes == 1536 * GB
    assert r.shortfall_bytes / GB == pytest.approx(25.3, abs=0.5)
    assert "25.29 GB" in r.summary() and "short" in r.summary()


def test_two_b200_nodes_fit():
    r = fit("B200-192G", 2)
    assert r.fits and r.headroom_bytes / GB == pytest.approx(1510.7, abs=0.5)


def test_four_h100_nodes_fit_with_about_1080_gib():
    r = fit("H100-80G", 4)
    assert r.fits
    assert r.capacity_bytes / GIB == pytest.approx(2534, abs=1)
    assert r.headroom_bytes / GIB == pytest.approx(1080, abs=1)


def test_four_h200_nodes_fit():
    assert fit("H200-141G", 4).fits


def test_three_h100_nodes_do_not_fit_and_tp_24_is_invalid():
    r = fit("H100-80G", 3)
    assert not r.fits and not r.tp_valid
    assert "valid sizes are 1, 2, 4, 8, 16, 32" in r.summary()


def test_five_h100_nodes_refused_because_40_does_not_divide_96():
    assert not fit("H100-80G", 5).fits


def test_hourly_cost_of_32_h100_is_83_20():
    assert sizing.hourly_cost_usd(catalog.PRICES["H100-80G"], 32) == 83.20
    assert sizing.hourly_cost_usd(None, 32) is None


def test_download_estimate_is_13_to_23_minutes():
    lo, hi = sizing.download_minutes(MODEL)
    assert 13 <= lo <= 14 and 22 <= hi <= 23
