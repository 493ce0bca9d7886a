"""The offline plan: what it prints for the shipped stacks, what it refuses, and that it needs no network."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from kimi_cluster.cli import plan

ROOT = Path(__file__).resolve().parents[2]
_CONNECT = socket.socket.connect
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIexampleexampleexample operator@laptop"


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
    """The plan must work offline: any outbound connection fails the test."""
    def refuse(*_a, **_k):
        raise AssertionError("the plan tried to open a network connection")
    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.delenv("HYPERSTACK_API_KEY", raising=False)


def write_stack(tmp_path: Path, body: str) -> str:
    path = tmp_path / "Pulumi.test.yaml"
    path.write_text("config:\n" + body)
    return str(path)


def test_dev_stack_plan(capsys):
    assert plan.main(["--stack", "dev"]) == 0
    out = capsys.readouterr().out
    assert out.count("n3-H100x8-NVLink") == 4
    assert "$83.20 per hour, from the catalog: 32 GPUs x $2.60 per GPU-hour on demand" in out
    assert "as of 2026-11" in out
    assert "fits with 1,159.65 GB (1,080.0 GiB) left" in out
    assert "--tp-size 32" in out and "--node-rank 3" in out
    assert "kimi-cluster:hfToken: not set" in out
    assert "documentation range" in out and "pulumi up refuses this" in out
    assert "$20M" in out and "Kimi K3.1-Pro" in out


def test_b300_stack_plan(capsys):
    assert plan.main(["--stack", "b300"]) == 0
    out = capsys.readouterr().out
    assert out.count("n3-B300-SXM6x8") == 1
    assert "$59.20 per hour" in out and "vllm/vllm-openai:kimi-k31" in out
    assert "peer" not in out


def test_json_plan_and_secrets_shown_as_set(tmp_path, capsys):
    cfg = write_stack(tmp_path, f"  kimi-cluster:operatorCidr: 198.18.0.7/32\n  kimi-cluster:sshPublicKey: {KEY}\n"
                                "  kimi-cluster:hfToken:\n    secure: v1:AAAAencrypted\n"
                                "  hyperstack:apiKey:\n    secure: v1:AAAAencrypted\n")
    assert plan.main(["--config", cfg, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["secrets"]["kimi-cluster:hfToken"] == "set"
    assert data["secrets"]["hyperstack:apiKey"] == "set"
    assert data["secrets"]["kimi-cluster:sshPrivateKey"] == "not set"
    assert data["hourly_cost_usd"] == 83.2 and len(data["nodes"]) == 4
    assert data["placeholders"] == []
    assert "AAAAencrypted" not in json.dumps(data)


@pytest.mark.parametrize(
    "body, expected",
    [
        ("  kimi-cluster:operatorCidr: 0.0.0.0/0\n", "kimi-cluster:operatorCidr"),
        ("  kimi-cluster:operatorCidr: not-a-cidr\n", "kimi-cluster:operatorCidr: 'not-a-cidr' is not a CIDR"),
        ("  kimi-cluster:operatorCidr: 198.18.0.7/32\n  kimi-cluster:modelRevision: main\n",
         "kimi-cluster:modelRevision"),
        ("  kimi-cluster:operatorCidr: 198.18.0.7/32\n  kimi-cluster:topology: custom\n"
         "  kimi-cluster:flavor: n3-B200x8\n  kimi-cluster:nodeCount: 1\n  kimi-cluster:gpusPerNode: 8\n"
         "  kimi-cluster:gpuMemoryGb: 192\n"
         "  kimi-cluster:engine: vllm\n", "25.29 GB (23.6 GiB) short"),
    ],
)
def test_bad_config_refused(tmp_path, capsys, body, expected):
    cfg = write_stack(tmp_path, body + f"  kimi-cluster:sshPublicKey: {KEY}\n")
    assert plan.main(["--config", cfg]) == 1
    err = capsys.readouterr().err
    assert expected in err


@pytest.mark.parametrize("body, expected", [
    ("  kimi-cluster:topology: b300x1-vllm\n  kimi-cluster:replicas: 2\n"
     "  kimi-cluster:extraEngineArgs: '[\"--chat-template-content-format\", \"openai\", \"--enforce-eager\"]'\n",
     "Streams      resume when their replica is lost (vllm): vLLM's render server on the front renders each stream "
     "with the replicas' chat layer (extraEngineArgs --chat-template-content-format openai)"),
    ("  kimi-cluster:topology: b300x1-vllm\n  kimi-cluster:replicas: 2\n  kimi-cluster:resumeStreams: false\n",
     "Streams      do not resume when their replica is lost (vllm): off (kimi-cluster:resumeStreams false)"),
    ("  kimi-cluster:topology: h100x4-sglang\n  kimi-cluster:replicas: 2\n",
     "Streams      resume when their replica is lost (sglang): SGLang's own chat route on the front"),
    ("  kimi-cluster:topology: b300x1-tokenspeed\n  kimi-cluster:replicas: 2\n"
     f"  kimi-cluster:image: lightseekorg/tokenspeed:0.1.1@sha256:{'a' * 64}\n",
     "Streams      do not resume when their replica is lost (tokenspeed): not on tokenspeed (TokenSpeed renders"),
    ("  kimi-cluster:topology: b300x1-vllm\n",
     "Streams      do not resume when their replica is lost (vllm): one replica (kimi-cluster:replicas 1)"),
])
def test_the_plan_says_whether_streams_resume_on_which_engine_and_why(tmp_path, capsys, body, expected):
    cfg = write_stack(tmp_path, body + f"  kimi-cluster:operatorCidr: 198.18.0.7/32\n"
                                       f"  kimi-cluster:sshPublicKey: {KEY}\n")
    assert plan.main(["--config", cfg]) == 0
    assert expected in capsys.readouterr().out


def test_a_chat_layer_flag_the_render_server_cannot_follow_is_refused_while_streams_resume(tmp_path, capsys):
    body = ("  kimi-cluster:topology: b300x1-vllm\n  kimi-cluster:replicas: 2\n"
            "  kimi-cluster:extraEngineArgs: '[\"--return-tokens-as-token-ids\"]'\n"
            f"  kimi-cluster:operatorCidr: 198.18.0.7/32\n  kimi-cluster:sshPublicKey: {KEY}\n")
    assert plan.main(["--config", write_stack(tmp_path, body)]) == 1
    assert ("kimi-cluster:extraEngineArgs sets --return-tokens-as-token-ids ('--return-tokens-as-token-ids'), which "
            "the front's render server cannot follow while streams resume") in capsys.readouterr().err
    # Without the front's resuming (resumeStreams false) the replicas take it.
    assert plan.main(["--config", write_stack(tmp_path, body + "  kimi-cluster:resumeStreams: false\n")]) == 0


def test_a_flag_that_shapes_sglangs_chat_route_is_refused_while_sglang_streams_resume(tmp_path, capsys):
    body = ("  kimi-cluster:topology: h100x4-sglang\n  kimi-cluster:replicas: 2\n"
            "  kimi-cluster:extraEngineArgs: '[\"--chat-template=/x.jinja\", \"--enable-metrics\"]'\n"
            f"  kimi-cluster:operatorCidr: 198.18.0.7/32\n  kimi-cluster:sshPublicKey: {KEY}\n")
    assert plan.main(["--config", write_stack(tmp_path, body)]) == 1
    err = capsys.readouterr().err
    assert ("kimi-cluster:extraEngineArgs sets --chat-template ('--chat-template=/x.jinja'), which shapes SGLang's "
            "chat route and which the front's chat layer does not take while streams resume") in err
    assert "--enable-metrics" not in err
    # Without the front's resuming, or with one replica, the replicas take it.
    assert plan.main(["--config", write_stack(tmp_path, body + "  kimi-cluster:resumeStreams: false\n")]) == 0
    assert plan.main(["--config", write_stack(tmp_path, body.replace("replicas: 2", "replicas: 1"))]) == 0


def test_missing_stack_file(capsys):
    assert plan.main(["--stack", "nope"]) == 2
    assert "no stack config" in capsys.readouterr().err


def test_render_dir_writes_every_nodes_scripts(tmp_path, capsys):
    assert plan.main(["--stack", "dev", "--render-dir", str(tmp_path / "r")]) == 0
    nodes = sorted(p.name for p in (tmp_path / "r").iterdir())
    assert nodes == [f"kimi-dev-node{r}" for r in range(4)]
    for node in nodes:
        assert len(list((tmp_path / "r" / node).glob("*.sh"))) >= 5


def test_cli_entry_point_runs():
    proc = subprocess.run([sys.executable, "-m", "kimi_cluster.cli.plan", "--stack", "dev"], cwd=ROOT,
                          capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "$83.20 per hour" in proc.stdout


def test_a_set_key_makes_the_plan_use_the_pricebook_and_show_the_difference(tmp_path, capsys, monkeypatch):
    from kimi_cluster.fakes.hyperstack_emulator.emulator import DEFAULT_API_KEY, Emulator

    monkeypatch.setattr(socket.socket, "connect", _CONNECT)  # this plan is allowed to ask the (local) API
    with Emulator() as emu:
        emu.set_price("H100-80G-PCIe-NVLink", 2.75)
        monkeypatch.setenv("HYPERSTACK_API_KEY", DEFAULT_API_KEY)
        cfg = write_stack(tmp_path, f"  kimi-cluster:operatorCidr: 198.18.0.7/32\n  kimi-cluster:sshPublicKey: {KEY}\n"
                                    f"  hyperstack:apiUrl: {emu.base_url}\n"
                                    '  kimi-cluster:regions: \'["NORWAY-1", "CANADA-1"]\'\n')
        assert plan.main(["--config", cfg]) == 0
        out = capsys.readouterr().out
        assert plan.main(["--config", cfg, "--json"]) == 0
        data = json.loads(capsys.readouterr().out)
    assert "Cost         $88.00 per hour, from the Hyperstack pricebook read at 20" in out
    assert "entry 'H100-80G-PCIe-NVLink', $2.75 per GPU-hour x 32 GPUs" in out
    assert "the catalog says $83.20 (+$4.80 per hour from the pricebook)" in out
    assert "first with stock of NORWAY-1, CANADA-1 (chosen at the first up, then kept)" in out
    assert data["hourly_cost_usd"] == 88.0 and data["cost"]["source"] == "pricebook"
    assert data["cost"]["difference_usd"] == 4.8 and data["cost"]["catalog_usd_per_hour"] == 83.2


def test_an_encrypted_key_in_the_stack_file_falls_back_to_the_catalog_and_says_why(tmp_path, capsys):
    cfg = write_stack(tmp_path, f"  kimi-cluster:operatorCidr: 198.18.0.7/32\n  kimi-cluster:sshPublicKey: {KEY}\n"
                                "  hyperstack:apiKey:\n    secure: v1:AAAAencrypted\n")
    assert plan.main(["--config", cfg]) == 0
    out = capsys.readouterr().out
    assert "from the catalog" in out and "export HYPERSTACK_API_KEY for live prices" in out


def test_the_plan_shows_each_steps_node_side_deadline(capsys):
    assert plan.main(["--stack", "dev", "--json"]) == 0
    deadlines = json.loads(capsys.readouterr().out)["step_deadline_minutes"]
    assert set(deadlines) == {"ready", "storage", "image", "weights", "check", "launch", "proxy", "readiness"}
    assert deadlines["weights"] == 240 + 30 and deadlines["readiness"] == 60 + 5  # the stack's own timeouts + slack


def test_the_plan_models_the_time_to_an_endpoint_phase_by_phase(capsys):
    assert plan.main(["--stack", "dev", "--json"]) == 0
    b = json.loads(capsys.readouterr().out)["time_to_endpoint"]
    names = [p["phase"] for p in b["phases"]]
    assert names == ["VM boot and SSH", "image pull (alongside the weights)", "weights, every node pulls all",
                     "weights, sharded over 4 nodes", "check", "load to GPU", "kernel warm-up, cold",
                     "kernel warm-up, caches restored", "readiness and verification"]
    assert all(p["source"] and p["assumes"] and 0 < p["low_s"] <= p["high_s"] for p in b["phases"])
    by = {p["phase"]: p for p in b["phases"]}
    # 1,561 GB at 1.1-1.8 GiB/s per node: 13.5-22 minutes; shared by 4 nodes it is bound by the disk instead.
    assert (round(by["weights, every node pulls all"]["low_s"] / 60, 1),
            round(by["weights, every node pulls all"]["high_s"] / 60, 1)) == (13.5, 22.0)
    assert by["weights, sharded over 4 nodes"]["high_s"] < by["weights, every node pulls all"]["low_s"]
    assert by["kernel warm-up, caches restored"]["high_s"] <= 180 <= by["kernel warm-up, cold"]["low_s"] / 3
    assert not by["image pull (alongside the weights)"]["on_critical_path"]
    totals = b["totals"]
    naive, sharded, cached = (totals["every node pulls all, kernels cold"], totals["sharded weights, kernels cold"],
                              totals["sharded weights, kernel caches restored"])
    assert cached[1] < sharded[1] < naive[1] and cached[0] < sharded[0] < naive[0]
    assert plan.main(["--stack", "dev"]) == 0
    text = capsys.readouterr().out
    assert "Time to a verified endpoint" in text and "total, sharded weights, kernels cold" in text


def test_one_node_has_no_sharded_weights_phase(capsys):
    assert plan.main(["--stack", "b300", "--json"]) == 0
    b = json.loads(capsys.readouterr().out)["time_to_endpoint"]
    assert not any("sharded" in p["phase"] for p in b["phases"])
    assert set(b["totals"]) == {"every node pulls all, kernels cold", "weights, kernel caches restored",
                                "weights, first bring-up, kernels warmed beside the download (kernelWarmup)"}


def test_a_warm_up_beside_the_download_waits_for_the_image_and_leaves_the_restored_bring_up_alone():
    from dataclasses import replace as with_

    from kimi_cluster.operator import bringup
    from kimi_cluster.settings.loader import load_settings

    s = load_settings({"topology": "h100x4-sglang", "operatorCidr": "203.0.113.7/32",
                       "sshPublicKey": "ssh-ed25519 AAAAC3Nza test"}, "dev")
    cold = bringup.phases(s, sharded=True)
    beside = bringup.phases(s, sharded=True, warmup_beside=True)
    restored = bringup.phases(s, sharded=True, kernel_cache=True)
    # The warm-up needs the image: it runs after the pull, against the whole download.
    assert (beside[1].low_s, beside[1].high_s) == (cold[1].low_s + bringup.WARMUP_COLD_S[0],
                                                   cold[1].high_s + bringup.WARMUP_COLD_S[1])
    assert "docs.vllm.ai" in beside[1].source and beside[5] == restored[5]  # the launch reads the filled caches
    off_path = [with_(p, on_path=True) for p in (beside[1], beside[2])]
    first = bringup.total_s(beside)
    assert first[1] == bringup.total_s(beside[:1] + [max(off_path, key=lambda p: p.high_s)] + beside[3:])[1]
    assert bringup.total_s(restored) < first < bringup.total_s(cold)
    assert bringup.phases(s, sharded=True, kernel_cache=True, warmup_beside=True) == restored


def test_a_stack_with_the_warm_up_prints_its_first_and_later_bring_ups_side_by_side(tmp_path, capsys):
    cfg = write_stack(tmp_path, f"  kimi-cluster:operatorCidr: 198.18.0.7/32\n  kimi-cluster:sshPublicKey: {KEY}\n"
                                "  kimi-cluster:kernelWarmup: true\n")
    assert plan.main(["--config", cfg, "--json"]) == 0
    b = json.loads(capsys.readouterr().out)["time_to_endpoint"]
    assert b["formula"].startswith("T_vm + max(T_image + T_warmup_from_shapes, T_weights)")
    warmed = b["totals"]["sharded weights, first bring-up, kernels warmed beside the download (kernelWarmup)"]
    assert b["this_stack"] == warmed and b["this_stack_later"] == warmed  # no kernel cache: every bring-up warms
    assert warmed < b["totals"]["sharded weights, kernels cold"]
    rows = {p["phase"]: p for p in b["phases"]}
    beside = rows["image pull, then kernel warm-up from shapes (alongside the weights)"]
    assert "sglang/blob/v0.5.23/python/sglang/compile_deep_gemm.py" in beside["source"]
    assert not rows["kernel warm-up, cold"]["on_critical_path"]
    assert rows["kernel warm-up, caches restored"]["on_critical_path"]
    assert plan.main(["--config", cfg]) == 0
    text = capsys.readouterr().out
    assert re.search(r"this stack, first bring-up +[\d.]+-[\d.]+ min +\(kernels warmed beside the download\)", text)
    assert re.search(r"this stack, later bring-ups +[\d.]+-[\d.]+ min", text)
