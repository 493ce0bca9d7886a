"""Careless and hostile stack config, one example per class: each is refused before anything is billed, in one line
per problem that names its key, or (legitimate but risky) accepted with a warning."""

from __future__ import annotations

import json

import pytest

from kimi_cluster.blueprint.admission import admit
from kimi_cluster.settings import Settings, SettingsError
from kimi_cluster.settings.loader import load_settings

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIexampleexampleexample operator@laptop"
CUSTOM = {"topology": "custom", "flavor": "n3-H100x8-NVLink", "nodeCount": 4, "gpusPerNode": 8, "gpuMemoryGb": 80,
          "engine": "sglang"}


def _same(value: object) -> object:
    """A value as the settings keep it: URLs and paths without their trailing "/"."""
    if isinstance(value, dict):
        return {k: _same(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_same(v) for v in value]
    return value.rstrip("/") if isinstance(value, str) else value


SECRET_SET = {"hfToken": "hf_token_set", "sshPrivateKey": "ssh_private_key_set",
              "kernelCacheCredentials": "kernel_cache_credentials_set", "tlsPrivateKey": "tls_private_key_set"}


def taken(settings: Settings, raw: dict) -> Settings:
    """Each accepted key is set on the settings (a secret only counts as set) and reads back as it was given."""
    names = {field.alias or name: name for name, field in Settings.model_fields.items()}
    for key, given in raw.items():
        if key not in names:
            assert getattr(settings, SECRET_SET[key]), key
            continue
        assert names[key] in settings.model_fields_set, key
        got = getattr(settings, names[key])
        if isinstance(given, str) and given[:1] in "[{":
            given = json.loads(given)
        if hasattr(got, "model_dump"):
            got = {k: v for k, v in got.model_dump(by_alias=True).items() if k in given}
        if isinstance(given, str) and isinstance(got, bool):
            given = given == "true"
        assert _same(got) == _same(given), (key, got, given)
    return settings


def load(stack: str = "dev", **raw):
    raw.setdefault("operatorCidr", "198.18.0.7/32")
    raw.setdefault("sshPublicKey", KEY)
    return admit(load_settings(raw, stack))  # the settings' rules, then the plan's (the program runs both)


REFUSED = [
    # names that would collide once cut to Hyperstack's 50 characters
    ({"environmentName": "e" * 45}, "kimi-cluster:environmentName makes the name"),
    ({"environmentName": "e" * 50}, "at most 44 characters"),
    ({"environmentName": "kimi\n"}, "kimi-cluster:environmentName"),
    # flags the program owns
    ({"extraEngineArgs": '["--api-key", "sk-leak"]'}, "may not set --api-key"),
    ({"extraEngineArgs": '["--host=127.0.0.1"]'}, "may not set --host"),
    ({"extraEngineArgs": '["--port", "9"]'}, "may not set --port"),
    ({"extraEngineArgs": '["--tp-size", "4"]'}, "may not set --tp-size"),
    ({"extraEngineArgs": '["--tp-s", "4"]'}, "may not set --tp-size"),
    ({"extraEngineArgs": '["--model-path", "x/y"]'}, "may not set --model-path"),
    ({"extraEngineArgs": '["--tensor_parallel_size=4"]'}, "may not set --tensor-parallel-size"),
    ({"topology": "b300x1-vllm", "extraEngineArgs": '["-tp", "4"]'}, "may not set -tp"),
    ({"extraEngineArgs": '["--enable-metrics\\nreboot"]'}, "kimi-cluster:extraEngineArgs"),
    # addresses that open or lock out
    ({"operatorCidr": "0.0.0.0/1"}, "kimi-cluster:operatorCidr"),
    ({"operatorCidr": "128.0.0.0/7"}, "kimi-cluster:operatorCidr"),
    ({"operatorCidr": "127.0.0.1/32"}, "loopback"),
    ({"operatorCidr": "10.1.2.3/32"}, "private range"),
    ({"operatorCidr": "192.168.1.5"}, "private range"),
    ({"operatorCidr": "169.254.169.254/32"}, "link-local"),
    ({"operatorCidr": "100.72.1.1/32"}, "carrier-grade NAT"),
    ({"operatorCidr": "::1/128"}, "loopback"),
    ({"operatorCidr": "fd00::1/128"}, "unique local"),
    ({"operatorCidr": "::ffff:8.8.8.8/128"}, "IPv4-mapped"),
    ({"operatorCidr": "2001:4860::/32"}, "/48"),
    ({"operatorCidr": "198.18.0.7/32\n; rm -rf /"}, "kimi-cluster:operatorCidr"),
    # values that would only fail on the node, after billing
    ({"apiPort": 22}, "taken by SSH"),
    ({"apiPort": 20000}, "rendezvous"),
    ({**CUSTOM, "gpusPerNode": 4}, "kimi-cluster:flavor n3-H100x8-NVLink has 8x H100 per VM"),
    ({**CUSTOM, "gpuMemoryGb": 141}, "gpuMemoryGb 141 means H200"),
    ({"storagePath": "/"}, "kimi-cluster:storagePath"),
    ({"storagePath": "/etc"}, "system directory"),
    ({"storagePath": "/etc/kimi"}, "system directory"),
    ({"storagePath": "/ephemeral/../etc"}, "normalized"),
    ({"storagePath": ".."}, "absolute"),
    ({"storagePath": "/ephemeral/"}, "normalized"),
    ({"storagePath": "/eph emeral"}, "kimi-cluster:storagePath"),
    ({"nodeRoot": "./x/"}, "kimi-cluster:nodeRoot"),
    ({"nodeRoot": "/$(id)"}, "kimi-cluster:nodeRoot"),
    ({"image": "--privileged"}, "kimi-cluster:image"),
    ({"image": "x; reboot"}, "kimi-cluster:image"),
    ({"image": "lmsysorg/sglang:latest\n"}, "kimi-cluster:image"),
    ({"image": "Sglang:Latest"}, "kimi-cluster:image"),
    ({"sshUser": ""}, "kimi-cluster:sshUser"),
    ({"sshUser": "ubuntu admin"}, "kimi-cluster:sshUser"),
    ({"sshUser": "root\n"}, "kimi-cluster:sshUser"),
    ({"diskMarginGb": 10**17}, "kimi-cluster:diskMarginGb"),
    ({"downloadTimeoutMinutes": 10**15}, "kimi-cluster:downloadTimeoutMinutes"),
    ({"gpuHourlyPriceUsd": "inf"}, "kimi-cluster:gpuHourlyPriceUsd"),
    ({"gpuHourlyPriceUsd": "nan"}, "kimi-cluster:gpuHourlyPriceUsd"),
    ({"modelRevision": "6d0a0202956796543364d666ab19c6ad1a494ee1\n"}, "kimi-cluster:modelRevision"),
    ({"servedModelName": "kimi$(touch /tmp/pwned)"}, "kimi-cluster:servedModelName"),
    ({"servedModelName": 'kimi" \nexport X="1'}, "kimi-cluster:servedModelName"),
    ({"region": "CANADA-1\n"}, "kimi-cluster:region"),
    ({"osImage": "Ubuntu\n24.04"}, "kimi-cluster:osImage"),
    # secrets handled loosely
    ({"hfEndpoint": "https://user:hf_secret@mirror.example.com"}, "holds credentials"),
    ({"hfEndpoint": "https://mirror.example.com/?token=hf_x"}, "kimi-cluster:hfEndpoint"),
    ({"hfEndpoint": "http://mirror.example.com", "hfToken": "hf_x"}, "in clear text"),
    ({"hfEndpoint": "https://mirror.example.com\n"}, "kimi-cluster:hfEndpoint"),
    # a field's Python name is not a config key
    ({"hf_token_set": True}, "is not a known setting"),
]


@pytest.mark.parametrize("raw,needle", REFUSED, ids=[repr(r)[:60] for r, _ in REFUSED])
def test_refused_naming_the_key(raw, needle):
    with pytest.raises(SettingsError) as caught:
        load(**raw)
    text = str(caught.value)
    assert needle in text
    assert "kimi-cluster:" in text and "Traceback" not in text
    # every problem is one line that names its key
    for line in text.splitlines()[1:]:
        assert "kimi-cluster:" in line or "stack name" in line, line


def test_a_long_stack_name_collides_too():
    with pytest.raises(SettingsError, match="the stack name .* set kimi-cluster:environmentName to at most"):
        load(stack="s" * 40)
    assert load(stack="s" * 40, environmentName="short").node_name(3) == "short-node3"


def test_hostile_values_are_not_echoed_at_length():
    with pytest.raises(SettingsError) as caught:
        load(servedModelName="x" * 5000 + "$(id)")
    assert len(str(caught.value)) < 600


ACCEPTED = [
    {"environmentName": "e" * 44},
    {"operatorCidr": "10.1.2.3/32", "allowPrivateOperatorCidr": "true"},
    {"operatorCidr": "127.0.0.1/32", "allowPrivateOperatorCidr": True},
    {"operatorCidr": "2a01:4f8:c17::/48"},
    {"extraEngineArgs": '["--enable-metrics", "--log-level", "debug"]'},
    {"storagePath": "/ephemeral/kimi"},
    {"storagePath": "/mnt/nvme0"},
    {"image": "registry.example.com:5000/org/sglang:v0.5.23@sha256:" + "a" * 64},
    {"sshUser": "ec2-user"},
    {"hfEndpoint": "http://127.0.0.1:8123", "hfToken": "hf_x"},
    {"hfEndpoint": "http://mirror.internal:8080"},
    {"hfEndpoint": "https://hf-mirror.com/"},
    {"servedModelName": "moonshotai/Kimi-K3.1-Pro"},
    {**CUSTOM},
    {"topology": "custom", "flavor": "n3-B300-SXM6x8", "nodeCount": 1, "gpusPerNode": 8, "gpuMemoryGb": 288,
     "engine": "vllm"},
]


@pytest.mark.parametrize("raw", ACCEPTED, ids=[repr(r)[:60] for r in ACCEPTED])
def test_legitimate_values_accepted(raw):
    taken(load(**raw), raw)


def test_risky_but_legitimate_values_warn():
    wide = load(operatorCidr="81.0.0.0/12")
    assert any("kimi-cluster:operatorCidr 81.0.0.0/12 lets 1,048,576 addresses" in w for w in wide.warnings())
    plain = load_settings({"operatorCidr": "198.18.0.7/32", "sshPublicKey": KEY, "hfToken": "hf_plain"}, "dev",
                          plain_credentials=["kimi-cluster:hfToken"])
    warned = [w for w in plain.warnings() if "plain value" in w]
    assert warned and "pulumi config set --secret kimi-cluster:hfToken" in warned[0] and "hf_plain" not in warned[0]
