"""Every validation rule of the stack config, and that each error names its key."""

from pathlib import Path

import pytest

from kimi_cluster.settings import SettingsError
from kimi_cluster.settings.loader import config_keys, load_settings, placeholders, read_stack_file

ROOT = Path(__file__).resolve().parents[2]
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIexampleexampleexample operator@laptop"


def settings(**raw):
    raw.setdefault("operatorCidr", "198.18.0.7/32")
    if "keypairName" not in raw:
        raw.setdefault("sshPublicKey", KEY)
    return load_settings(raw, "dev")


def refused(match: str, **raw):
    with pytest.raises(SettingsError, match=match) as exc:
        settings(**raw)
    return str(exc.value)


def test_defaults_are_the_four_node_h100_cluster():
    s = settings()
    assert (s.flavor_name, s.nodes, s.gpus_per_node_count, s.engine_name) == ("n3-H100x8-NVLink", 4, 8, "sglang")
    assert s.tensor_parallel == 32 and s.region == "CANADA-1" and s.env_name == "kimi-dev"
    assert s.container_image == "lmsysorg/sglang:dev-kimi-k31-pro"
    assert s.vm_image == "Ubuntu Server 24.04 LTS R570 CUDA 12.8 with Docker"
    assert s.hourly_cost_usd == 83.20
    assert s.model_revision == "6d0a0202956796543364d666ab19c6ad1a494ee1"


def test_b300_preset():
    s = settings(topology="b300x1-vllm")
    assert (s.flavor_name, s.nodes, s.engine_name, s.tensor_parallel) == ("n3-B300-SXM6x8", 1, "vllm", 8)
    assert s.container_image == "vllm/vllm-openai:kimi-k31"
    assert s.vm_image == "Ubuntu Server 24.04 LTS R595 CUDA 13.2 with Docker"


@pytest.mark.parametrize("cidr", ["0.0.0.0/0", "::/0"])
def test_open_operator_cidr_refused(cidr):
    msg = refused("kimi-cluster:operatorCidr", operatorCidr=cidr)
    assert "whole internet" in msg and "pulumi config set kimi-cluster:operatorCidr" in msg


@pytest.mark.parametrize("cidr", ["not-a-cidr", "300.1.1.1/32", "10.0.0.1/33", ""])
def test_malformed_operator_cidr_refused(cidr):
    refused("kimi-cluster:operatorCidr: .* is not a CIDR", operatorCidr=cidr)


def test_operator_cidr_missing_is_required():
    with pytest.raises(SettingsError, match="kimi-cluster:operatorCidr is required; set it with"):
        load_settings({"sshPublicKey": KEY}, "dev")


def test_bare_address_becomes_slash_32():
    assert settings(operatorCidr="198.18.0.7").operator_cidr == "198.18.0.7/32"


@pytest.mark.parametrize("rev", ["main", "v1.0", "6d0a02029567", "6D0A0202956796543364D666AB19C6AD1A494EE1"])
def test_unpinned_revision_refused(rev):
    refused("kimi-cluster:modelRevision: .* not a 40-hex commit", modelRevision=rev)


def test_b200_custom_cluster_refused_with_shortfall():
    msg = refused("25.29 GB", topology="custom", flavor="n3-B200x8", nodeCount=1, gpusPerNode=8,
                  gpuMemoryGb=192, engine="vllm")
    assert "will not load" in msg


def test_two_node_b200_custom_cluster_accepted_without_price():
    s = settings(topology="custom", flavor="n3-B200x8", nodeCount=2, gpusPerNode=8, gpuMemoryGb=192, engine="sglang")
    assert s.fit.fits and s.hourly_cost_usd is None
    assert any("gpuHourlyPriceUsd" in w for w in s.warnings())
    assert settings(topology="custom", flavor="x", nodeCount="2", gpusPerNode="8", gpuMemoryGb="192",
                    engine="sglang", gpuHourlyPriceUsd="5").hourly_cost_usd == 80.0


def test_custom_needs_all_shape_keys():
    refused("topology custom needs kimi-cluster:nodeCount, kimi-cluster:gpusPerNode, kimi-cluster:gpuMemoryGb, "
            "kimi-cluster:engine", topology="custom", flavor="x")


def test_custom_unknown_gpu_size_refused():
    refused("gpuMemoryGb 100 is not a known GPU size", topology="custom", flavor="x", nodeCount=1, gpusPerNode=8,
            gpuMemoryGb=100, engine="vllm")


def test_vllm_multi_node_refused():
    refused("vllm is supported on one node only", topology="custom", flavor="x", nodeCount=2, gpusPerNode=8,
            gpuMemoryGb=192, engine="vllm")


def test_shape_keys_refused_on_a_preset():
    refused("kimi-cluster:nodeCount only apply to topology custom", nodeCount=2)


def test_unknown_topology_and_key_refused():
    refused("kimi-cluster:topology", topology="h100x3")
    msg = refused("kimi-cluster:operatorCIDR is not a known setting", operatorCIDR="1.2.3.4/32")
    assert "operatorCidr" in msg


def test_keypair_choice():
    refused("set kimi-cluster:sshPublicKey .* or kimi-cluster:keypairName", sshPublicKey=None)
    refused("set only one of", keypairName="mine", sshPublicKey=KEY)
    assert settings(keypairName="mine", sshPublicKey=None).keypair_name == "mine"
    refused("kimi-cluster:sshPublicKey: not an OpenSSH public key", sshPublicKey="hello")


def test_names_and_ports_bounded():
    refused("kimi-cluster:environmentName", environmentName="x" * 51)
    refused("kimi-cluster:apiPort", apiPort=70000)
    refused("kimi-cluster:nodeRoot", nodeRoot="/tmp/$(rm -rf /)")


def test_extra_engine_args_from_json_string():
    assert settings(extraEngineArgs='["--enable-metrics"]').extra_engine_args == ["--enable-metrics"]
    refused("kimi-cluster:extraEngineArgs", extraEngineArgs="--enable-metrics")


def test_secrets_only_count_as_set():
    s = settings(hfToken="hf_canary_secret", sshPrivateKey="-----BEGIN canary")
    assert s.hf_token_set and s.ssh_private_key_set
    assert "hf_canary_secret" not in s.model_dump_json() and "canary" not in repr(s)


def test_unpinned_image_warns_and_digest_does_not():
    assert any("without a digest" in w for w in settings().warnings())
    pinned = settings(image="lmsysorg/sglang@sha256:" + "a" * 64)
    assert not any("digest" in w for w in pinned.warnings())


def test_every_key_is_documented_in_the_configuration_reference():
    reference = (ROOT / "docs" / "configuration.md").open(encoding="utf-8").read()
    missing = [k for k in config_keys() if f"| `{k}` |" not in reference]
    assert not missing, f"docs/configuration.md lacks {missing}"


def test_shipped_dev_stack_validates_but_is_flagged_as_placeholder():
    raw, _ = read_stack_file(str(ROOT / "Pulumi.dev.yaml"))
    s = load_settings(raw, "dev")
    found = placeholders(s)
    assert any("operatorCidr" in p for p in found) and any("sshPublicKey" in p for p in found)
    assert placeholders(settings()) == []


@pytest.mark.parametrize("cidr", ["2001:4860::/32", "2a00:1450::/29", "2a01:4f8::/47"])
def test_ipv6_operator_cidr_wider_than_one_site_refused(cidr):
    msg = refused("kimi-cluster:operatorCidr", operatorCidr=cidr)
    assert "/48" in msg and "curl -4" in msg


@pytest.mark.parametrize("cidr", ["2a01:4f8:c17::/48", "2a01:4f8:c17:1234::7/128", "2a01:4f8:c17:1234::7"])
def test_ipv6_operator_cidr_of_one_site_or_host_accepted(cidr):
    assert settings(operatorCidr=cidr).operator_cidr.startswith("2a01:4f8:c17")


def _ssh_keygen(tmp_path, passphrase: str) -> str:
    import subprocess

    path = tmp_path / f"key{len(passphrase)}"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", passphrase, "-C", "test", "-f", str(path)], check=True)
    return path.read_text()


def test_passphrase_protected_ssh_key_refused_with_the_deploy_key_hint(tmp_path):
    key = _ssh_keygen(tmp_path, "correct horse battery staple")
    msg = refused("kimi-cluster:sshPrivateKey is protected by a passphrase", sshPrivateKey=key)
    assert "ssh-keygen -t ed25519 -N '' -f" in msg
    body = key.splitlines()[1]
    assert body not in msg  # the key itself is never echoed


def test_unencrypted_ssh_key_accepted(tmp_path):
    assert settings(sshPrivateKey=_ssh_keygen(tmp_path, "")).ssh_private_key_set


@pytest.mark.parametrize("value,reason", [
    (KEY, "holds a public key"),
    ("~/.ssh/id_ed25519", "looks like a file name"),
    ("-----BEGIN RSA PRIVATE KEY-----\nProc-Type: 4,ENCRYPTED\nDEK-Info: AES-128-CBC,00\n\nAAAA\n"
     "-----END RSA PRIVATE KEY-----\n", "is protected by a passphrase"),
    ("-----BEGIN ENCRYPTED PRIVATE KEY-----\nMIIB\n-----END ENCRYPTED PRIVATE KEY-----\n",
     "is protected by a passphrase"),
])
def test_ssh_private_key_mistakes_refused_without_echoing_it(value, reason):
    msg = refused(f"kimi-cluster:sshPrivateKey {reason}", sshPrivateKey=value)
    assert value.strip().splitlines()[-1] not in msg


def test_how_to_set_puts_secret_before_the_key_for_secrets_only():
    from kimi_cluster import settings as s

    assert s.how_to_set("hfToken") == "set it with: pulumi config set --secret kimi-cluster:hfToken hf_..."
    assert s.how_to_set("region") == "set it with: pulumi config set kimi-cluster:region CANADA-1"
