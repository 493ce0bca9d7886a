"""The stack's CA and server certificate (kimi_cluster/deploy/tls.py) and the settings that shape the endpoint's access:
apiAllowedCidrs, apiKeyVersion, enginePort and your own tlsCertificate."""

from __future__ import annotations

import datetime as dt
import ipaddress

import pytest
from cryptography import x509

from kimi_cluster.deploy import tls
from kimi_cluster.settings import SettingsError
from kimi_cluster.settings.loader import load_settings

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIexampleexampleexample operator@laptop"


def settings(**raw):
    return load_settings({"operatorCidr": "198.18.0.7/32", "sshPublicKey": KEY, **raw}, "dev")


def test_server_certificate_names_the_address_chains_to_the_ca_and_serves_tls_only():
    ca, ca_key = tls.make_ca("test CA")
    cert_pem, key_pem = tls.make_server_certificate(ca, ca_key, ["198.51.100.10"], ["kimi.example.com"])
    tls.check_key_matches(cert_pem, key_pem)
    cert = x509.load_pem_x509_certificate(cert_pem.encode())
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(a) for a in sans.get_values_for_type(x509.IPAddress)] == ["198.51.100.10"]
    assert sans.get_values_for_type(x509.DNSName) == ["kimi.example.com"]
    assert cert.issuer == x509.load_pem_x509_certificate(ca.encode()).subject
    cert.verify_directly_issued_by(x509.load_pem_x509_certificate(ca.encode()))
    usage = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert [u.dotted_string for u in usage] == ["1.3.6.1.5.5.7.3.1"]  # serverAuth only
    assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    with pytest.raises(ValueError, match="does not belong"):
        tls.check_key_matches(cert_pem, tls.make_ca("other")[1])


def test_the_ca_never_changes_and_the_server_certificate_follows_the_address_and_renews():
    assert tls._CaProvider().diff("id", {"common_name": "a"}, {"common_name": "b"}).changes is False
    ca, ca_key = tls.make_ca("test CA")
    olds = tls._ServerCertProvider().create({"ca_cert_pem": ca, "ca_key_pem": ca_key, "ip_addresses": ["1.2.3.4"],
                                             "dns_names": []}).outs
    same = {**olds}
    assert tls._ServerCertProvider().diff("id", olds, same).changes is False
    moved = tls._ServerCertProvider().diff("id", olds, {**same, "ip_addresses": ["1.2.3.5"]})
    assert moved.changes and moved.replaces == ["ip_addresses"]
    short, _ = tls.make_server_certificate(ca, ca_key, ["1.2.3.4"], days=tls.RENEW_DAYS - 1)
    due = tls._ServerCertProvider().diff("id", {**olds, "cert_pem": short}, same)
    assert due.replaces == ["cert_pem"]
    assert tls.not_after(olds["cert_pem"]) - dt.datetime.now(dt.UTC) > dt.timedelta(days=800)


def test_api_cidrs_default_to_the_operator_and_wide_ones_are_warned_about():
    assert settings().api_cidrs == ["198.18.0.7/32"]
    # (a public /8: a private one is refused unless allowPrivateOperatorCidr, as for operatorCidr)
    wide = settings(apiAllowedCidrs='["44.0.0.0/8", "198.18.0.7"]')
    assert wide.api_cidrs == ["44.0.0.0/8", "198.18.0.7/32"]
    assert any("apiAllowedCidrs entry 44.0.0.0/8 is wider than /16" in w for w in wide.warnings())
    assert not any("apiAllowedCidrs" in w for w in settings(apiAllowedCidrs='["198.51.100.0/24"]').warnings())


@pytest.mark.parametrize("value, reason", [
    ('["0.0.0.0/0"]', "whole internet"), ('["::/0"]', "whole internet"), ('["nope"]', "is not a CIDR"),
    ("[]", "non-empty list"), ('{"a": 1}', "is not a CIDR"),
])
def test_bad_api_cidrs_are_refused_naming_the_key(value, reason):
    with pytest.raises(SettingsError, match=rf"kimi-cluster:apiAllowedCidrs: .*{reason}"):
        settings(apiAllowedCidrs=value)


def test_key_version_engine_port_and_own_certificate_are_checked_naming_their_keys():
    assert settings(apiKeyVersion="3").api_key_version == 3
    with pytest.raises(SettingsError, match="kimi-cluster:apiKeyVersion"):
        settings(apiKeyVersion="0")
    with pytest.raises(SettingsError, match="kimi-cluster:enginePort 8000 collides"):
        settings(enginePort="8000")
    with pytest.raises(SettingsError, match="kimi-cluster:tlsCertificate: not a PEM certificate chain"):
        settings(tlsCertificate="hello", tlsPrivateKey="x")
    with pytest.raises(SettingsError, match="tlsCertificate and kimi-cluster:tlsPrivateKey go together"):
        settings(tlsCertificate=tls.make_ca("own")[0])
    # A whole chain (leaf, then its CA) for apiHostname, with the leaf's own key (kimi_cluster/settings/tls_check.py).
    ca, ca_key = tls.make_ca("own")
    leaf, leaf_key = tls.make_server_certificate(ca, ca_key, [], ["api.example.com"])
    own = settings(tlsCertificate=leaf + ca, tlsPrivateKey=leaf_key, apiHostname="api.example.com")
    assert own.tls_certificate and own.tls_private_key_set
    assert any("proxyImage" in w for w in settings(proxyImage="caddy:2.11.7-alpine").warnings())
    assert not any("proxyImage" in w for w in settings().warnings())


def _verify(ca_pem: str, leaf_pem: str, name: x509.DNSName | x509.IPAddress) -> None:
    """Chain-verify `leaf_pem` for `name` against `ca_pem` alone, name constraints included (RFC 5280 rules)."""
    from cryptography.x509 import verification

    ca = x509.load_pem_x509_certificate(ca_pem.encode())
    leaf = x509.load_pem_x509_certificate(leaf_pem.encode())
    verifier = verification.PolicyBuilder().store(verification.Store([ca])).build_server_verifier(name)
    verifier.verify(leaf, [])


def test_a_ca_for_an_api_hostname_cannot_vouch_for_another_name():
    from cryptography.x509.verification import VerificationError

    # The attack: whoever holds the stack CA's key (it sits in the state) makes a certificate for another host, and a
    # client told to trust the CA accepts it. An unconstrained CA (no apiHostname) still allows it, as the README says.
    loose, loose_key = tls.make_ca("loose CA")
    forged, _ = tls.make_server_certificate(loose, loose_key, [], ["api.anthropic.com"])
    _verify(loose, forged, x509.DNSName("api.anthropic.com"))

    ca, ca_key = tls.make_ca("team CA", permitted_dns_names=["kimi.team.example.com"])
    constraint = x509.load_pem_x509_certificate(ca.encode()).extensions.get_extension_for_class(x509.NameConstraints)
    assert constraint.critical
    served, _ = tls.make_server_certificate(ca, ca_key, ["198.51.100.10"], ["kimi.team.example.com"])
    _verify(ca, served, x509.DNSName("kimi.team.example.com"))
    _verify(ca, served, x509.IPAddress(ipaddress.ip_address("198.51.100.10")))  # IPs unconstrained: a new address works
    forged, _ = tls.make_server_certificate(ca, ca_key, [], ["api.anthropic.com"])
    with pytest.raises(VerificationError):
        _verify(ca, forged, x509.DNSName("api.anthropic.com"))


def test_the_ca_provider_records_its_constraint_and_old_cas_without_one_still_create():
    made = tls._CaProvider().create({"common_name": "c", "permitted_dns_names": ["kimi.team.example.com"]})
    assert made.outs["permitted_dns_names"] == ["kimi.team.example.com"]
    old = tls._CaProvider().create({"common_name": "c"})  # inputs as a stack made before the constraint recorded them
    cert = x509.load_pem_x509_certificate(old.outs["cert_pem"].encode())
    with pytest.raises(x509.ExtensionNotFound):
        cert.extensions.get_extension_for_class(x509.NameConstraints)
