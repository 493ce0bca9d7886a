"""Careless and hostile input, second round: the keys that arrived after the first (deadlines, kernelCache, ports,
proxyImage, apiAllowedCidrs, bring-your-own TLS, apiHostname) and stack files that blow up. Each is refused before
anything bills, in lines that each name their key, or accepted as the legitimate value it is."""

from __future__ import annotations

import datetime as dt
import json

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from kimi_cluster import blueprint as render
from kimi_cluster.blueprint.admission import admit
from kimi_cluster.blueprint.inputs import resolved_timing
from kimi_cluster.deploy import tls
from kimi_cluster.plan.steps import clocks
from kimi_cluster.plan.steps.table import NAMES
from kimi_cluster.settings import (
    CACHE_STEP_MIN_MINUTES,
    DURATION_MAX_MINUTES,
    ERROR_MAX_LINES,
    SettingsError,
    timing,
    tls_check,
)
from kimi_cluster.settings.loader import load_settings, plain_credentials_in, read_stack_file
from tests.bad_input.test_settings_refusals import taken

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIexampleexampleexample operator@laptop"
CREDS = "AKIDEXAMPLE:wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"
HOST = "api.example.com"


def load(**raw):
    raw.setdefault("operatorCidr", "198.18.0.7/32")
    raw.setdefault("sshPublicKey", KEY)
    return load_settings(raw, "dev")


def cache(**fields):
    return {"kernelCache": json.dumps({"bucket": "my-team-kimi-kernels", **fields}), "kernelCacheCredentials": CREDS}


REFUSED = [
    # 1. durations: one rule, bounded on both sides
    ({"stepDeadlineMinutes": '{"image": Infinity}'}, "kimi-cluster:stepDeadlineMinutes: image: inf is not a finite"),
    ({"stepDeadlineMinutes": '{"image": NaN}'}, "not a finite number"),
    ({"stepDeadlineMinutes": '{"image": 1e308}'}, "longer than 10080 minutes"),
    ({"stepDeadlineMinutes": '{"weights": 200000000}'}, "longer than 10080 minutes"),
    ({"stepDeadlineMinutes": '{"ready": 0.0167}'}, "shorter than 0.05 minutes"),  # one second
    ({"stepDeadlineMinutes": '{"cache-restore": 2}', **cache()}, "cache-restore first installs its S3 client"),
    ({"stepDeadlineMinutes": '{"cache-save": 15}', **cache()}, "shorter than 16: cache-save first installs"),
    ({"kernelCache": {"bucket": "abc-kernels", "restoreTimeoutMinutes": float("inf")}, "kernelCacheCredentials": CREDS},
     "kimi-cluster:kernelCache.restoreTimeoutMinutes"),
    ({"kernelCache": {"bucket": "abc-kernels", "saveTimeoutMinutes": 1e308}, "kernelCacheCredentials": CREDS},
     "kimi-cluster:kernelCache.saveTimeoutMinutes"),
    ({**cache(saveTimeoutMinutes=10**9)}, "kimi-cluster:kernelCache.saveTimeoutMinutes"),
    ({**cache(restoreTimeoutMinutes=0)}, "kimi-cluster:kernelCache.restoreTimeoutMinutes"),
    ({"downloadTimeoutMinutes": "inf"}, "kimi-cluster:downloadTimeoutMinutes"),
    ({"readinessTimeoutMinutes": "nan"}, "kimi-cluster:readinessTimeoutMinutes"),
    # 2. kernelCache.endpointUrl follows the hfEndpoint rule, and plain http only on a private path
    ({**cache(endpointUrl="https://AKID:secret@s3.example.com")}, "holds credentials"),
    ({**cache(endpointUrl="https://s3.example.com/?X-Amz-Security-Token=abc")}, "kimi-cluster:kernelCache.endpointUrl"),
    ({**cache(endpointUrl="http://s3.example.com")}, "anyone on the path could swap the kernel archive"),
    ({**cache(endpointUrl="http://203.0.113.9:9000")}, "plain http://"),
    ({**cache(endpointUrl="https://s3.example.com\n")}, "kimi-cluster:kernelCache.endpointUrl"),
    ({**cache(endpointUrl="https://s3.example.com:99999")}, "kimi-cluster:kernelCache.endpointUrl"),
    # 3. a cache that would turn itself off
    ({**cache(bucket="my-team-kimi-kernels\n")}, "kimi-cluster:kernelCache.bucket"),
    ({**cache(bucket="My_Bucket")}, "kimi-cluster:kernelCache.bucket"),
    ({**cache(bucket="192.168.1.1")}, "IP address"),
    ({**cache(bucket="xn--kernels")}, "reserves"),
    ({**cache(bucket="kernels-s3alias")}, "reserves"),
    ({**cache(bucket="kernels.-x")}, "kimi-cluster:kernelCache.bucket"),
    ({**cache(), "kernelCacheCredentials": "AKIAONLYTHEKEYID"}, "kimi-cluster:kernelCacheCredentials is not"),
    ({**cache(), "kernelCacheCredentials": ":secret"}, "kimi-cluster:kernelCacheCredentials"),
    ({**cache(), "kernelCacheCredentials": "AKID:secret with space"}, "spaces or control characters"),
    # 4. ports that collide on the node
    ({"enginePort": 22}, "kimi-cluster:enginePort 22 collides"),
    ({"enginePort": 20000}, "kimi-cluster:enginePort 20000 collides"),
    ({"enginePort": 20100}, "kimi-cluster:peerPort 20100 collides"),
    ({"apiPort": 20100}, "kimi-cluster:peerPort 20100 collides"),
    ({"apiPort": 30000}, "kimi-cluster:enginePort 30000 collides"),
    # the kernel warm-up's own ports (kimi_cluster/plan/warmup.py), taken whether or not it is on
    ({"enginePort": 20060}, "kimi-cluster:enginePort 20060 is taken by the kernel warm-up's engine"),
    ({"peerPort": 20050}, "kimi-cluster:peerPort 20050 is taken by the kernel warm-up's rendezvous"),
    ({"apiPort": 20062}, "port 20062 is taken by the kernel warm-up's engine"),
    # 5. one image rule for image and proxyImage
    ({"proxyImage": "caddy:2\n"}, "kimi-cluster:proxyImage"),
    ({"proxyImage": "caddy@sha256:abc"}, "kimi-cluster:proxyImage"),
    ({"proxyImage": "caddy:2@sha256:" + "a" * 40}, "kimi-cluster:proxyImage"),
    ({"proxyImage": "Caddy:2"}, "kimi-cluster:proxyImage"),
    ({"proxyImage": "caddy::2"}, "kimi-cluster:proxyImage"),
    ({"proxyImage": "caddy/../x:2"}, "kimi-cluster:proxyImage"),
    ({"image": "lmsysorg/sglang:dev@sha256:" + "a" * 40}, "kimi-cluster:image"),
    # 6. apiAllowedCidrs: operatorCidr's classes per entry, and the union
    ({"apiAllowedCidrs": '["0.0.0.0/1", "128.0.0.0/1"]'}, "in all, more than two /8s"),
    ({"apiAllowedCidrs": json.dumps([f"{i}.0.0.0/8" for i in (44, 45, 46)])}, "in all"),
    ({"apiAllowedCidrs": '["fe80::1%eth0/128"]'}, "is not a CIDR"),
    ({"apiAllowedCidrs": '["::ffff:8.8.8.8/128"]'}, "IPv4-mapped"),
    ({"apiAllowedCidrs": '["127.0.0.1/32"]'}, "loopback"),
    ({"apiAllowedCidrs": '["10.0.0.0/8"]'}, "private range"),
    ({"apiAllowedCidrs": '["224.0.0.0/8"]'}, "multicast"),
    ({"apiAllowedCidrs": '["2000::/3"]'}, "is wider than /48"),
    ({"apiAllowedCidrs": '["44.0.0.0/7"]'}, "is wider than /8"),
    ({"apiAllowedCidrs": '["2001:db8::/47", "2001:db9::/48"]'}, "in all"),
    ({"apiAllowedCidrs": json.dumps([f"44.0.{i // 256}.{i % 256}/32" for i in range(300)])}, "at most 256"),
    # 7. apiHostname
    ({"apiHostname": "https://api.example.com"}, "kimi-cluster:apiHostname"),
    ({"apiHostname": "api.example.com\n"}, "kimi-cluster:apiHostname"),
    ({"apiHostname": "198.51.100.7"}, "kimi-cluster:apiHostname"),
    ({"apiHostname": "api.example.com."}, "kimi-cluster:apiHostname"),
    ({"apiHostname": "api.$(id).com"}, "kimi-cluster:apiHostname"),
]


@pytest.mark.parametrize("raw,needle", REFUSED, ids=[repr(r)[:70] for r, _ in REFUSED])
def test_refused_naming_the_key(raw, needle):
    with pytest.raises(SettingsError) as caught:
        admit(load(**raw))  # as the program, `plan` and `status` take them: what the step table refuses too
    text = str(caught.value)
    assert needle in text, text
    assert "Traceback" not in text and len(text) < 3000
    for line in text.splitlines()[1:]:
        assert "kimi-cluster:" in line, line
    assert "wJalrXUtnFEMI" not in text and "secret with space" not in text  # a credential is never quoted


ACCEPTED = [
    {"stepDeadlineMinutes": '{"image": 90, "ready": 1}'},
    {"stepDeadlineMinutes": '{"cache-restore": 16, "cache-save": 45}', **cache()},
    {"downloadTimeoutMinutes": DURATION_MAX_MINUTES},
    cache(endpointUrl="https://s3.eu-central-1.amazonaws.com"),
    cache(endpointUrl="http://10.0.0.5:9000"),
    cache(endpointUrl="http://127.0.0.1:9000/"),
    cache(endpointUrl="http://[fd00::5]:9000"),
    cache(bucket="team.kimi-kernels.2026"),
    {"enginePort": 31000, "peerPort": 20200, "apiPort": 8443},
    {"proxyImage": "caddy:2.11.7-alpine@sha256:" + "d" * 64},
    {"proxyImage": "registry.example.com:5000/caddy:2"},
    {"apiAllowedCidrs": '["44.0.0.0/8", "198.18.0.7/32"]'},
    {"apiAllowedCidrs": '["198.51.100.0/24", "2001:db8:1::/48"]'},
    {"operatorCidr": "127.0.0.1/32", "allowPrivateOperatorCidr": True, "apiAllowedCidrs": '["127.0.0.0/8"]'},
    {"apiHostname": "kimi-api.team.example.com"},
]


@pytest.mark.parametrize("raw", ACCEPTED, ids=[repr(r)[:70] for r in ACCEPTED])
def test_legitimate_values_accepted(raw):
    taken(load(**raw), raw)


def test_every_deadline_becomes_a_custom_timeout_go_can_parse():
    # time.ParseDuration (Go's time package) takes at most 2^63 - 1 nanoseconds, about 2,562,047 hours.
    go_max_minutes = (2**63 - 1) / 1e9 / 60
    s = load(downloadTimeoutMinutes=DURATION_MAX_MINUTES, readinessTimeoutMinutes=24 * 60,
             stepDeadlineMinutes=json.dumps({step: DURATION_MAX_MINUTES for step in NAMES}),
             **cache(restoreTimeoutMinutes=DURATION_MAX_MINUTES, saveTimeoutMinutes=DURATION_MAX_MINUTES))
    for step in NAMES:
        text = clocks.clock(step, resolved_timing(s, timing.Timing())).timeout
        assert text.endswith("m") and int(text[:-1]) < go_max_minutes / 1000, (step, text)


def test_the_cache_step_floor_is_the_install_budget_the_slack_and_a_minute():
    assert CACHE_STEP_MIN_MINUTES * 60 == timing.PIP_BUDGET_S + timing.Timing().deadline_slack_s + 60
    s = admit(load(stepDeadlineMinutes=json.dumps({"cache-restore": CACHE_STEP_MIN_MINUTES}), **cache()))
    # The transfer keeps a minute of its own: the step's deadline cannot end it before its own deadline warns.
    deadline = clocks.deadline_s("cache-restore", resolved_timing(s, timing.Timing()))
    assert timing.Timing().kernel_cache_transfer_s(deadline) == 60


def test_an_alias_bomb_is_refused_in_one_short_line(tmp_path):
    levels = ['a: &a ["x","x","x","x","x","x","x","x","x"]']
    for prev, cur in zip("abcdef", "bcdefg", strict=True):
        levels.append(f"{cur}: &{cur} [{','.join([f'*{prev}'] * 9)}]")
    path = tmp_path / "Pulumi.bomb.yaml"
    path.write_text("\n".join(levels) + "\nconfig:\n  kimi-cluster:extraEngineArgs: *g\n", encoding="utf-8")
    with pytest.raises(SettingsError) as caught:
        read_stack_file(str(path))
    assert "through its aliases" in str(caught.value) and len(str(caught.value)) < 300
    # A file with a few honest aliases still loads.
    path.write_text("base: &b 198.18.0.7/32\nconfig:\n  kimi-cluster:operatorCidr: *b\n", encoding="utf-8")
    assert read_stack_file(str(path))[0] == {"operatorCidr": "198.18.0.7/32"}


def test_an_error_quotes_a_bounded_number_of_problems():
    with pytest.raises(SettingsError) as caught:
        load(extraEngineArgs=json.dumps([1] * 250))  # one "should be a valid string" per item
    text = str(caught.value)
    assert len(text.splitlines()) <= ERROR_MAX_LINES + 2 and "more problems" in text and len(text) < 20_000


# ---- 7. bring-your-own TLS ------------------------------------------------------------------------------------------

NOW = dt.datetime.now(dt.UTC)


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _pem(cert: x509.Certificate) -> str:
    return cert.public_bytes(serialization.Encoding.PEM).decode()


def _key_pem(key: ec.EllipticCurvePrivateKey, password: bytes | None = None) -> str:
    enc = serialization.BestAvailableEncryption(password) if password else serialization.NoEncryption()
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, enc).decode()


def _cert(subject: str, key, issuer: str | None = None, issuer_key=None, ca: bool = False, days=(-1, 90),
          dns=(HOST,)) -> x509.Certificate:
    b = (x509.CertificateBuilder()
         .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
         .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer or subject)]))
         .public_key(key.public_key()).serial_number(x509.random_serial_number())
         .not_valid_before(NOW + dt.timedelta(days=days[0])).not_valid_after(NOW + dt.timedelta(days=days[1]))
         .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if dns and not ca:
        b = b.add_extension(x509.SubjectAlternativeName([x509.DNSName(d) for d in dns]), critical=False)
    return b.sign(issuer_key or key, hashes.SHA256())


CA_KEY, LEAF_KEY, OTHER_KEY = _key(), _key(), _key()
CA = _cert("Team CA", CA_KEY, ca=True)
LEAF = _cert(HOST, LEAF_KEY, "Team CA", CA_KEY)
GOOD = _pem(LEAF) + _pem(CA)


def byo(chain: str, key: str | None = None, host: str | None = HOST):
    raw = {"tlsCertificate": chain, "tlsPrivateKey": key or _key_pem(LEAF_KEY)}
    if host:
        raw["apiHostname"] = host
    return load(**raw)


TLS_REFUSED = [
    (lambda: (_pem(_cert(HOST, LEAF_KEY, "Team CA", CA_KEY, days=(-30, -1))) + _pem(CA), None), "expired on"),
    (lambda: (_pem(_cert(HOST, LEAF_KEY, "Team CA", CA_KEY, days=(3, 90))) + _pem(CA), None), "not valid before"),
    (lambda: (_pem(LEAF) + _pem(_cert("Other CA", OTHER_KEY, ca=True)), None), "do not chain"),
    (lambda: (_pem(LEAF) + _pem(_cert("Team CA", OTHER_KEY, ca=True)), None), "do not chain"),  # same name, not it
    (lambda: (_pem(CA) + _pem(LEAF), None), "starts with a CA certificate"),
    (lambda: (_pem(LEAF), None), "holds one certificate"),
    (lambda: (_pem(CA), _key_pem(CA_KEY)), "holds one certificate"),
    (lambda: (_pem(LEAF) + _pem(_cert("Team CA", CA_KEY)), None), "not a CA certificate"),
    (lambda: (GOOD, _key_pem(OTHER_KEY)), "kimi-cluster:tlsPrivateKey does not belong to the leaf"),
    (lambda: (GOOD, _key_pem(LEAF_KEY, b"pass")), "kimi-cluster:tlsPrivateKey is protected by a passphrase"),
    (lambda: (GOOD, "not a key at all"), "kimi-cluster:tlsPrivateKey is not a PEM private key"),
    (lambda: (GOOD + _key_pem(LEAF_KEY), None), "holds a private key"),
    (lambda: (_pem(_cert(HOST, LEAF_KEY, "Team CA", CA_KEY, dns=("other.example.com",))) + _pem(CA), None),
     "does not name kimi-cluster:apiHostname"),
    (lambda: (_pem(_cert(HOST, LEAF_KEY, "Team CA", CA_KEY, dns=("*.a.example.com",))) + _pem(CA), None),
     "does not name"),
]


@pytest.mark.parametrize("make,needle", TLS_REFUSED, ids=[n for _, n in TLS_REFUSED])
def test_own_tls_is_refused_unless_it_chains_is_current_and_matches_its_key(make, needle):
    chain, key = make()
    with pytest.raises(SettingsError) as caught:
        byo(chain, key)
    text = str(caught.value)
    assert needle in text, text
    # a key is never quoted
    secret_lines = [line for k in (key or _key_pem(LEAF_KEY), _key_pem(LEAF_KEY)) for line in k.splitlines()
                    if line and not line.startswith("-----")]
    assert not any(line in text for line in secret_lines) and "not a key at all" not in text


def test_own_tls_needs_api_hostname_and_a_good_chain_passes():
    with pytest.raises(SettingsError, match="kimi-cluster:tlsCertificate needs kimi-cluster:apiHostname"):
        byo(GOOD, host=None)
    s = byo(GOOD)
    assert s.tls_certificate == GOOD and s.api_hostname == HOST
    wild = _pem(_cert(HOST, LEAF_KEY, "Team CA", CA_KEY, dns=("*.example.com",))) + _pem(CA)
    assert byo(wild).api_hostname == HOST
    # the project's own helpers make a chain that passes too
    ca, ca_key = tls.make_ca("own")
    leaf, leaf_key = tls.make_server_certificate(ca, ca_key, [], [HOST])
    assert tls_check.chain_problem(leaf + ca, HOST) is None and tls_check.key_problem(leaf + ca, leaf_key) is None


def test_a_plain_tls_private_key_is_warned_about():
    assert plain_credentials_in({"kimi-cluster:tlsPrivateKey": "-----BEGIN PRIVATE KEY-----"}) == \
        ["kimi-cluster:tlsPrivateKey"]
    assert plain_credentials_in({"kimi-cluster:tlsPrivateKey": {"secure": "v1:abc"}}) == []
    s = load_settings({"operatorCidr": "198.18.0.7/32", "sshPublicKey": KEY}, "dev", ["kimi-cluster:tlsPrivateKey"])
    assert any("kimi-cluster:tlsPrivateKey is set as a plain value" in w for w in s.warnings())


def test_the_readiness_wait_checks_tls_for_the_api_hostname():
    s = load(apiHostname=HOST)
    text = render.render_step(s, "readiness", 0, "<unused>", "<unused>", public_ip="198.51.100.10")
    lines = text.splitlines()
    assert f"BASE=https://{HOST}:8000" in lines and f"CONNECT_TO={HOST}:8000:127.0.0.1:8000" in lines
    plain = render.render_step(load(), "readiness", 0, "<unused>", "<unused>", public_ip="198.51.100.10")
    assert "BASE=https://198.51.100.10:8000" in plain.splitlines()


@pytest.mark.parametrize("raw", [
    {"stepDeadlineMinutes": '{"image": 1' + "0" * 5000 + "}"},
    {"stepDeadlineMinutes": {"image": 10**5000}},
    {"downloadTimeoutMinutes": 10**5000},
    {"apiAllowedCidrs": "[" + "1" * 5000 + "]"},
    {"extraEngineArgs": "[" * 100_000},
    {"regions": "[" * 100_000},
    {"kernelCache": '{"a":' * 100_000, "kernelCacheCredentials": CREDS},
    {"stepDeadlineMinutes": {"image": [[1] * 9] * 9}},
], ids=lambda r: next(iter(r)))
def test_huge_numbers_and_deep_nesting_end_in_a_short_refusal(raw):
    with pytest.raises(SettingsError) as caught:
        load(**raw)
    assert len(str(caught.value)) < 600


def test_a_deeply_nested_stack_file_is_one_refusal(tmp_path):
    path = tmp_path / "Pulumi.deep.yaml"
    path.write_text("config:\n  kimi-cluster:regions: " + "[" * 50_000 + "]" * 50_000 + "\n", encoding="utf-8")
    with pytest.raises(SettingsError, match="nests deeper|YAML"):
        read_stack_file(str(path))


def test_an_own_leaf_near_its_end_is_accepted_with_a_warning():
    soon = _pem(_cert(HOST, LEAF_KEY, "Team CA", CA_KEY, days=(-60, 10))) + _pem(CA)
    assert any("tlsCertificate's leaf expires on" in w for w in byo(soon).warnings())
    assert not any("expires" in w for w in byo(GOOD).warnings())
