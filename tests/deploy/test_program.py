"""The whole program under Pulumi's mocks: the resource graph per topology, the outputs, and where secrets go."""

from __future__ import annotations

import base64
import json

import pytest

import kimi_cluster
from kimi_cluster.deploy import tls
from tests.pulumi_harness import Recording, dumps, run_program

PUBLIC_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIexampleexampleexample operator@laptop"
CANARY_SSH = "-----BEGIN OPENSSH PRIVATE KEY-----canary-ssh-7f3a"
CANARY_HF = "hf_canaryTOKEN9d2c"
CANARY_HS = "hs-canary-api-key-55e1"
CANARY_API = "endpoint-canary-key-b61d"
CANARY_PEER = "peer-canary-token-77aa"
CANARY_TLS = "tls-canary-private-key-0c7e"
# One real CA and server certificate: the program parses the CA (its fingerprint is an output).
CA_PEM, CA_KEY = tls.make_ca("test CA")
CERT_PEM, _ = tls.make_server_certificate(CA_PEM, CA_KEY, ["198.51.100.10"])


def outputs_for(typ: str, name: str, inputs: dict) -> dict:
    """What the providers would answer: addresses per rank, ids, a generated key."""
    if typ.endswith(":VirtualMachine"):
        rank = int(name.rsplit("node", 1)[1])
        return {"vm_id": 1000 + rank, "public_ip": f"198.51.100.{10 + rank}", "private_ip": f"10.0.0.{10 + rank}",
                "status": "ACTIVE"}
    if typ.endswith(":Placement"):
        return {"region": inputs["regions"][-1], "chosen_at": "2026-12-01T08:00:00+00:00"}
    if typ.endswith(":Environment"):
        return {"environment_id": 7}
    if typ.endswith(":Keypair"):
        return {"keypair_id": 8, "fingerprint": "ff:00"}
    if typ.endswith(":GeneratedSecret"):
        if name.endswith("peer-token"):
            return {"value": CANARY_PEER}
        # A new version is a new key, as the provider would make it.
        version = int(inputs.get("version") or 1)
        return {"value": CANARY_API if version == 1 else f"{CANARY_API}-v{version}"}
    if typ.endswith(":CertificateAuthority"):
        return {"cert_pem": CA_PEM, "key_pem": CA_KEY}
    if typ.endswith(":ServerCertificate"):
        return {"cert_pem": CERT_PEM, "key_pem": CANARY_TLS}
    if typ.endswith(":SecurityRule"):
        return {"rule_id": 9}
    if typ.startswith("command:"):
        return {"stdout": "ok", "stderr": ""}
    return {}


def config(**extra: str) -> tuple[dict[str, str], list[str]]:
    cfg = {
        "kimi-cluster:operatorCidr": "198.18.0.7/32",
        "kimi-cluster:sshPublicKey": PUBLIC_KEY,
        "kimi-cluster:sshPrivateKey": CANARY_SSH,
        "kimi-cluster:hfToken": CANARY_HF,
        "hyperstack:apiKey": CANARY_HS,
        # Nothing listens there: the cost falls back to the catalog at once, and no test reaches the real API.
        "hyperstack:apiUrl": "http://127.0.0.1:9/v1",
    }
    cfg.update({f"kimi-cluster:{k}": v for k, v in extra.items()})
    return cfg, ["kimi-cluster:sshPrivateKey", "kimi-cluster:hfToken", "hyperstack:apiKey"]


@pytest.fixture(scope="module")
def dev():
    cfg, secret = config()
    return run_program(cfg, secret, outputs_for)


@pytest.fixture(scope="module")
def b300():
    cfg, secret = config(topology="b300x1-vllm")
    return run_program(cfg, secret, outputs_for)


def test_dev_graph_has_one_environment_one_keypair_four_vms(dev):
    assert len(dev.of_type(":Environment")) == 1
    assert len(dev.of_type(":Keypair")) == 1
    vms = dev.of_type(":VirtualMachine")
    assert sorted(v.inputs["name"] for v in vms) == [f"kimi-dev-node{r}" for r in range(4)]
    assert {v.inputs["flavor_name"] for v in vms} == {"n3-H100x8-NVLink"}
    assert {v.inputs["image_name"] for v in vms} == {"Ubuntu Server 24.04 LTS R570 CUDA 12.8 with Docker"}


def test_dev_firewall_is_least_privilege(dev):
    rules = dev.of_type(":SecurityRule")
    # head: SSH + API + 3 peers; each worker: SSH + 3 peers
    assert len(rules) == 5 + 3 * 4
    sources = {r.inputs["remote_ip_prefix"] for r in rules}
    assert sources == {"198.18.0.7/32"} | {f"10.0.0.{10 + r}/32" for r in range(4)}
    api = [r for r in rules if r.inputs.get("port_range_min") == 8000]
    assert len(api) == 1 and api[0].name.endswith("node0-api")
    assert "0.0.0.0/0" not in json.dumps([r.inputs for r in rules])


def test_api_rules_are_exactly_the_allowed_cidrs_on_the_api_port_and_ssh_stays_the_operators():
    cfg, secret = config(apiAllowedCidrs='["198.18.0.7/32", "198.51.100.0/24", "2001:db8:1::/48"]', apiPort="8443")
    rules = run_program(cfg, secret, outputs_for).of_type(":SecurityRule")
    api = [r.inputs for r in rules if r.inputs.get("port_range_min") == 8443]
    assert sorted(r["remote_ip_prefix"] for r in api) == ["198.18.0.7/32", "198.51.100.0/24", "2001:db8:1::/48"]
    assert all(r["port_range_max"] == 8443 and r["protocol"] == "tcp" for r in api)
    assert {r["ethertype"] for r in api if ":" in r["remote_ip_prefix"]} == {"IPv6"}
    ssh = [r.inputs for r in rules if r.inputs.get("port_range_min") == 22]
    assert len(ssh) == 4 and {r["remote_ip_prefix"] for r in ssh} == {"198.18.0.7/32"}
    # Every rule is either SSH, the API port, or a peer's private /32: nothing is world-open.
    for r in rules:
        prefix = r.inputs["remote_ip_prefix"]
        assert not prefix.endswith("/0"), r.name
        assert r.inputs.get("port_range_min") in (22, 8443) or prefix.startswith("10.0.0."), r.name


@pytest.mark.parametrize("cidrs", ['["0.0.0.0/0"]', '["198.18.0.7/32", "::/0"]', '["not-a-cidr"]'])
def test_world_open_or_malformed_api_cidrs_are_refused_before_any_resource(cidrs):
    cfg, secret = config(apiAllowedCidrs=cidrs)
    rec = Recording()
    with pytest.raises(Exception, match="kimi-cluster:apiAllowedCidrs"):
        run_program(cfg, secret, outputs_for, recording=rec)
    assert rec.resources == []


def test_b300_graph_has_one_vm_and_no_peer_rules(b300):
    vms = b300.of_type(":VirtualMachine")
    assert [v.inputs["flavor_name"] for v in vms] == ["n3-B300-SXM6x8"]
    rules = b300.of_type(":SecurityRule")
    assert sorted(r.name.rsplit("-", 1)[1] for r in rules) == ["api", "ssh"]


def test_outputs_contract(dev):
    out = dev.exports
    assert out["endpoint_url"] == "https://198.51.100.10:8000"
    assert out["openai_base_url"] == "https://198.51.100.10:8000/v1"
    assert out["anthropic_base_url"] == "https://198.51.100.10:8000"
    assert out["ca_certificate"] == CA_PEM and out["ca_certificate_sha256"] == tls.fingerprint(CA_PEM)
    assert out["api_key_version"] == 1 and out["api_allowed_cidrs"] == ["198.18.0.7/32"]
    assert out["client_configs"]["ca_certificate"]["pem"] == CA_PEM
    assert out["client_configs"]["claude_code"]["env"]["NODE_EXTRA_CA_CERTS"].endswith("ca.pem")
    assert "--cacert" in out["client_configs"]["openai"]["curl"]
    assert out["served_model_name"] == out["model"] == "moonshotai/Kimi-K3.1-Pro"
    assert out["model_revision"] == "6d0a0202956796543364d666ab19c6ad1a494ee1"
    assert out["head_public_ip"] == "198.51.100.10"
    assert out["node_public_ips"] == [f"198.51.100.{10 + r}" for r in range(4)]
    assert out["node_private_ips"] == [f"10.0.0.{10 + r}" for r in range(4)]
    assert (out["topology"], out["engine"], out["hourly_cost_usd"]) == ("h100x4-sglang", "sglang", 83.2)
    assert set(out["client_configs"]) >= {"openai", "claude_code", "kimi_code", "openclaw"}
    assert out["api_key"] == CANARY_API and dev.export_secrets == {"api_key"}
    assert out["kimi_cluster_version"] == kimi_cluster.__version__ != "unknown"


def test_secrets_never_reach_a_plain_input_or_output(dev, b300):
    for rec in (dev, b300):
        for res in rec.resources:
            text = dumps(res.plain())
            for canary in (CANARY_SSH, CANARY_HF, CANARY_HS, CANARY_API, CANARY_TLS, CA_KEY, CANARY_PEER):
                assert canary not in text, f"{canary} in plain input of {res.typ} {res.name}"
        for key, value in rec.exports.items():
            if key not in rec.export_secrets:
                for canary in (CANARY_SSH, CANARY_HF, CANARY_HS, CANARY_API, CANARY_TLS, CA_KEY):
                    assert canary not in json.dumps(value), f"{canary} in output {key}"


def test_each_rule_goes_with_its_vm_and_no_stateless_providers_code_is_a_secret(dev, b300):
    for rec in (dev, b300):
        rules = rec.of_type(":SecurityRule")
        assert rules
        for rule in rules:
            # deletedWith names the VM the rule is on (its vm_id input comes from that VM).
            assert rule.deleted_with and rule.deleted_with in {v.name for v in rec.of_type(":VirtualMachine")}
            assert rule.deleted_with in rule.deps, (rule.name, rule.deleted_with, rule.deps)
        for res in rec.resources:
            if "__provider" in res.raw:
                # Only a serialized provider that captured a secret would be one: none of ours does.
                assert "__provider" not in res.secret_paths(), res.name
        assert all(not r.deleted_with for r in rec.resources if not r.typ.endswith(":SecurityRule"))


def test_only_the_heads_proxy_and_readiness_get_the_key_never_a_worker_or_an_engine(dev, b300):
    for rec in (dev, b300):
        holders = {r.name for r in rec.resources if CANARY_API in dumps(r.values())}
        assert holders == {"kimi-node0-proxy", "kimi-ready-wait"}, holders
        for r in rec.of_type("command:remote:Command"):
            if r.name.endswith("-launch"):
                script = r.script()
                assert "stdin" not in r.values() and "API_KEY" not in script and "--api-key" not in script
                assert "--host 127.0.0.1" in script
        # The TLS key travels base64-encoded on the proxy's stdin; the certificate resource holds it as a secret.
        tls_line = base64.b64encode(CANARY_TLS.encode()).decode()
        tls_holders = {r.name for r in rec.resources if tls_line in dumps(r.values())}
        assert tls_holders == {"kimi-node0-proxy"}, tls_holders
        proxy = rec.by_name["kimi-node0-proxy"]
        assert proxy.values()["stdin"] == f"{CANARY_API}\n{tls_line}\n" and "stdin" in proxy.secret_paths()


def test_hyperstack_key_is_never_a_resource_input(dev):
    for res in dev.resources:
        assert CANARY_HS not in json.dumps(res.inputs, default=str), res.name


def test_placeholders_refused_before_any_resource():
    cfg, secret = config(operatorCidr="203.0.113.7/32")
    rec = Recording()
    with pytest.raises(Exception, match="kimi-cluster:operatorCidr .* documentation range"):
        run_program(cfg, secret, outputs_for, recording=rec)
    assert rec.resources == []


def test_missing_private_key_refused():
    cfg, secret = config()
    del cfg["kimi-cluster:sshPrivateKey"]
    with pytest.raises(Exception, match="kimi-cluster:sshPrivateKey is required"):
        run_program(cfg, secret, outputs_for)


def test_passphrase_protected_private_key_refused_before_any_resource(tmp_path):
    import subprocess

    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "s3cret", "-f", str(tmp_path / "k")], check=True)
    cfg, secret = config()
    cfg["kimi-cluster:sshPrivateKey"] = (tmp_path / "k").read_text()
    rec = Recording()
    with pytest.raises(Exception, match="sshPrivateKey is protected by a passphrase.*ssh-keygen -t ed25519 -N ''"):
        run_program(cfg, secret, outputs_for, recording=rec)
    assert rec.resources == []


def test_undersized_cluster_refused_naming_the_shortfall():
    cfg, secret = config(topology="custom", flavor="n3-B200x8", nodeCount="1", gpusPerNode="8",
                         gpuMemoryGb="192", engine="vllm")
    with pytest.raises(Exception, match="25.29 GB .* short"):
        run_program(cfg, secret, outputs_for)


def test_dev_chain_per_node_and_the_order_across_nodes(dev):
    res = dev.by_name
    commands = dev.of_type("command:remote:Command")
    assert len(commands) == 4 * 6 + 2  # six steps per node, the proxy and one readiness wait on the head
    for rank in range(4):
        ready = res[f"kimi-node{rank}-ready"]
        # SSH must be open before the first dial; every rule of the node precedes its chain
        assert f"kimi-node{rank}-ssh" in ready.deps
        assert ready.values()["connection"]["host"] == f"198.51.100.{10 + rank}"
        assert f"kimi-node{rank}-check" in res[f"kimi-node{rank}-launch"].deps
    for rank in range(1, 4):
        assert "kimi-node0-launch" in res[f"kimi-node{rank}-launch"].deps
        # workers join the head's rendezvous on its private address
        assert "10.0.0.10:20000" in res[f"kimi-node{rank}-launch"].script()
    wait = next(r for r in commands if r.parent == "kimi-ready")
    assert {f"kimi-node{r}-launch" for r in range(4)} | {"kimi-node0-proxy"} <= set(wait.deps)
    # The readiness wait goes through the proxy over TLS, checking the certificate for the public address.
    script = wait.script()
    assert "BASE=https://198.51.100.10:8000" in script and '--cacert "$CA_FILE"' in script
    assert "CONNECT_TO=198.51.100.10:8000:127.0.0.1:8000" in script


def test_b300_chain_is_one_node(b300):
    commands = b300.of_type("command:remote:Command")
    assert len(commands) == 6 + 2


def test_new_cidr_image_or_flags_touch_only_rules_and_the_launch(dev):
    """Such changes replace rules or the container, never a VM, never the weights."""
    cfg, secret = config(operatorCidr="198.18.0.99/32", image="lmsysorg/sglang@sha256:" + "b" * 64,
                         extraEngineArgs='["--enable-metrics"]')
    changed = run_program(cfg, secret, outputs_for)
    before, after = dev.by_name, changed.by_name
    assert set(before) == set(after)
    differing = {name for name in before if dumps(before[name].plain()) != dumps(after[name].plain())}
    for name in differing:
        assert (name.endswith(("-ssh", "-api", "-image", "-launch")) or name == "kimi-ready-wait"), name
    assert {f"kimi-node{r}-launch" for r in range(4)} <= differing
    assert {"kimi-node0-ssh", "kimi-node0-api"} <= differing
    for rank in range(4):
        for unchanged in (f"kimi-node{rank}", f"kimi-node{rank}-weights", f"kimi-node{rank}-check",
                          f"kimi-node{rank}-storage"):
            assert unchanged not in differing, unchanged


def test_new_revision_reruns_download_check_and_launch_but_keeps_the_vms(dev):
    cfg, secret = config(modelRevision="0" * 40)
    changed = run_program(cfg, secret, outputs_for).by_name
    before = dev.by_name
    for rank in range(4):
        assert dumps(before[f"kimi-node{rank}"].plain()) == dumps(changed[f"kimi-node{rank}"].plain())
        for step in ("weights", "check", "launch"):
            name = f"kimi-node{rank}-{step}"
            assert dumps(before[name].plain()) != dumps(changed[name].plain()), name


def test_regions_reach_the_placement_and_its_choice_places_everything():
    cfg, secret = config(regions='["CANADA-1", "NORWAY-1"]')
    rec = run_program(cfg, secret, outputs_for)
    (placement,) = rec.of_type(":Placement")
    assert placement.inputs["regions"] == ["CANADA-1", "NORWAY-1"]
    assert (placement.inputs["flavor_name"], placement.inputs["count"]) == ("n3-H100x8-NVLink", 4)
    # The mock placement picks the last region listed: the environment and every VM follow it.
    assert rec.of_type(":Environment")[0].inputs["region"] == "NORWAY-1"
    assert {v.inputs["region"] for v in rec.of_type(":VirtualMachine")} == {"NORWAY-1"}
    assert rec.exports["region"] == "NORWAY-1"


def test_region_and_regions_together_are_refused_naming_both():
    cfg, secret = config(region="CANADA-1", regions='["NORWAY-1"]')
    rec = Recording()
    with pytest.raises(Exception, match="kimi-cluster:region .* and kimi-cluster:regions"):
        run_program(cfg, secret, outputs_for, recording=rec)
    assert rec.resources == []


def test_hourly_cost_uses_the_pricebook_when_a_key_is_set_and_says_so():
    from kimi_cluster.fakes.hyperstack_emulator.emulator import DEFAULT_API_KEY, Emulator

    with Emulator() as emu:
        emu.set_price("H100-80G-PCIe-NVLink", 2.25)
        cfg, secret = config()
        cfg.update({"hyperstack:apiUrl": emu.base_url, "hyperstack:apiKey": DEFAULT_API_KEY})
        rec = run_program(cfg, secret, outputs_for)
    out = rec.exports
    assert out["hourly_cost_usd"] == 72.0 and out["hourly_cost_catalog_usd"] == 83.2
    assert "Hyperstack pricebook read at 20" in out["hourly_cost_source"]
    assert "the catalog says $83.20 (-$11.20 per hour from the pricebook)" in out["hourly_cost_source"]


def test_hourly_cost_falls_back_to_the_catalog_with_its_date(dev):
    source = dev.exports["hourly_cost_source"]
    assert dev.exports["hourly_cost_usd"] == 83.2 and "from the catalog" in source and "as of 2026-11" in source
    assert "pricebook not read" in source  # a key is set, but nothing answers at the test's API URL
def _differing(before: Recording, after: Recording) -> set[str]:
    b, a = before.by_name, after.by_name
    return {n for n in set(b) | set(a) if n not in b or n not in a or dumps(b[n].values()) != dumps(a[n].values())}


def test_key_rotation_touches_only_the_key_the_proxy_step_and_the_readiness_wait(dev):
    cfg, secret = config(apiKeyVersion="2")
    rotated = run_program(cfg, secret, outputs_for)
    assert _differing(dev, rotated) == {"kimi-api-key", "kimi-node0-proxy", "kimi-ready-wait"}
    assert rotated.by_name["kimi-api-key"].inputs["version"] == 2
    assert rotated.by_name["kimi-node0-proxy"].values()["stdin"].startswith(f"{CANARY_API}-v2\n")
    assert rotated.exports["api_key_version"] == 2


def test_a_new_api_cidr_list_touches_only_firewall_rules(dev):
    cfg, secret = config(apiAllowedCidrs='["198.18.0.7/32", "198.51.100.0/24"]')
    wider = run_program(cfg, secret, outputs_for)
    assert _differing(dev, wider) == {"kimi-node0-api-198-51-100-0-24"}
    assert wider.exports["api_allowed_cidrs"] == ["198.18.0.7/32", "198.51.100.0/24"]


def test_a_multi_node_stack_generates_one_peer_token_and_a_single_node_none(dev, b300):
    assert sorted(s.name.rsplit("-", 2)[-2] + "-" + s.name.rsplit("-", 1)[1]
                  for s in dev.of_type(":GeneratedSecret")) == ["api-key", "peer-token"]
    assert [s.name.rsplit("-", 1)[1] for s in b300.of_type(":GeneratedSecret")] == ["key"]
    weights = [c for c in dev.of_type("command:remote:Command") if c.name.endswith("-weights")]
    assert len(weights) == 4 and all("stdin" in c.secret_paths() for c in weights)
def test_a_credential_set_without_secret_is_warned_never_shown(monkeypatch):
    import pulumi

    seen: list[str] = []
    monkeypatch.setattr(pulumi, "warn", lambda message, *args, **kwargs: seen.append(str(message)))
    cfg, secret = config()
    secret.remove("kimi-cluster:hfToken")
    run_program(cfg, secret, outputs_for)
    warned = [w for w in seen if "plain value" in w]
    assert warned == [w for w in warned if "kimi-cluster:hfToken" in w] and len(warned) == 1
    assert "--secret kimi-cluster:hfToken" in warned[0] and CANARY_HF not in " ".join(seen)
