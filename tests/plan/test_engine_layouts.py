"""vLLM's layouts on one node (kimi-cluster:engineLayout): under mocks each registers today's graph with no key in
the engine, its own parallelism flags, its own kernel-cache key and its own context window for clients."""

from __future__ import annotations

import json

import pytest

from kimi_cluster.blueprint.admission import admit
from kimi_cluster.blueprint.inputs import engine_inputs
from kimi_cluster.plan import kernel_cache, launch
from kimi_cluster.settings import SettingsError, catalog
from kimi_cluster.settings.loader import load_settings
from tests.deploy.test_program import CANARY_API, config, outputs_for
from tests.pulumi_harness import run_program

LAYOUT_FLAGS = {
    "tp8": ["--tensor-parallel-size 8"],
    "dp8-ep": ["--data-parallel-size 8", "--enable-expert-parallel"],
    "tp8-dcp8": ["--tensor-parallel-size 8", "--decode-context-parallel-size 8", "--max-model-len 1048576"],
}
BASE = {"operatorCidr": "203.0.113.7/32", "sshPublicKey": "ssh-ed25519 AAAAC3Nza test", "topology": "b300x1-vllm"}


def _graph(rec):
    return sorted((r.typ, r.name) for r in rec.resources)


@pytest.fixture(scope="module")
def graphs():
    out = {"default": run_program(*config(topology="b300x1-vllm"), outputs_for)}
    for layout in catalog.VLLM_LAYOUTS:
        out[layout] = run_program(*config(topology="b300x1-vllm", engineLayout=layout), outputs_for)
    return out


@pytest.mark.parametrize("layout", list(catalog.VLLM_LAYOUTS))
def test_each_layout_registers_todays_graph_and_the_key_never_reaches_the_engine(graphs, layout):
    rec = graphs[layout]
    assert _graph(rec) == _graph(graphs["default"])
    holders = {r.name for r in rec.resources if CANARY_API in json.dumps(r.values(), default=str)}
    assert holders == {"kimi-node0-proxy", "kimi-ready-wait"}
    script = rec.by_name["kimi-node0-launch"].script()
    assert "--api-key" not in script and "--host 127.0.0.1" in script
    for flag in LAYOUT_FLAGS[layout]:
        assert flag in script, (layout, flag)
    others = {f for name, flags in LAYOUT_FLAGS.items() if name != layout for f in flags} - set(LAYOUT_FLAGS[layout])
    for flag in others:
        assert flag not in script, (layout, flag)


def test_the_default_is_tp8_and_renders_todays_launch_byte_for_byte(graphs):
    default = graphs["default"].by_name["kimi-node0-launch"].script()
    assert default == graphs["tp8"].by_name["kimi-node0-launch"].script()


def test_client_configs_follow_the_layouts_context_unless_contextwindow_is_set(graphs):
    texts = {name: json.dumps(rec.exports["client_configs"]) for name, rec in graphs.items()}
    assert '"contextWindow": 131072' in texts["default"] and '"contextWindow": 131072' in texts["dp8-ep"]
    assert '"contextWindow": 1048576' in texts["tp8-dcp8"]
    set_by_user = run_program(*config(topology="b300x1-vllm", engineLayout="tp8-dcp8", contextWindow="200000"),
                              outputs_for)
    assert '"contextWindow": 200000' in json.dumps(set_by_user.exports["client_configs"])


def test_maxmodellen_caps_the_context_clients_are_told_and_the_engines():
    s = load_settings({**BASE, "engineLayout": "tp8-dcp8", "maxModelLen": "524288"}, "dev")
    assert s.client_context_window == 524288
    argv = launch.flatten(launch.engine_argv(engine_inputs(s), 0, "<head>"))
    assert argv[argv.index("--max-model-len") + 1] == "524288"


def test_each_layout_has_its_own_kernel_cache_and_tp8s_is_todays():
    keys = {name: kernel_cache.cache_key(engine_inputs(load_settings({**BASE, "engineLayout": name}, "dev")))
            for name in catalog.VLLM_LAYOUTS}
    assert len({k.id for k in keys.values()}) == 3
    assert keys["tp8"].id == kernel_cache.cache_key(engine_inputs(load_settings(BASE, "dev"))).id
    assert ("--decode-context-parallel-size", "8") in keys["tp8-dcp8"].kernel_flags
    assert ("--data-parallel-size", "8") in keys["dp8-ep"].kernel_flags
    assert ("--enable-expert-parallel", "") in keys["dp8-ep"].kernel_flags


def test_a_layout_on_another_engine_or_shape_is_refused_naming_the_key():
    with pytest.raises(SettingsError, match="kimi-cluster:engineLayout dp8-ep is a layout of vLLM on one node"):
        load_settings({**BASE, "topology": "h100x4-sglang", "engineLayout": "dp8-ep"}, "dev")
    with pytest.raises(SettingsError, match="kimi-cluster:engineLayout"):
        load_settings({**BASE, "engineLayout": "tp4"}, "dev")


@pytest.mark.parametrize("arg", ["-dp", "--data-parallel-size=2", "--decode-context-parallel-size", "-dcp",
                                 "--tensor-parallel-size"])
def test_extra_engine_args_cannot_change_the_layout(arg):
    with pytest.raises(SettingsError, match="extraEngineArgs may not set"):
        admit(load_settings({**BASE, "extraEngineArgs": json.dumps([arg, "2"])}, "dev"))


def test_the_plan_prints_what_each_layout_trades_and_its_source(capsys, tmp_path, monkeypatch):
    from kimi_cluster.cli import plan

    monkeypatch.delenv("HYPERSTACK_API_KEY", raising=False)
    cfg = tmp_path / "Pulumi.l.yaml"
    cfg.write_text("config:\n" + "".join(f"  kimi-cluster:{k}: {v}\n" for k, v in
                                         {**BASE, "engineLayout": "dp8-ep"}.items()))
    assert plan.main(["--config", str(cfg)]) == 0
    out = capsys.readouterr().out
    assert "Layout       dp8-ep" in out and "  * dp8-ep" in out
    assert "18.5M tokens of KV cache" in out and "7% to 25% slower" in out
    assert out.count("source: ") >= 3
