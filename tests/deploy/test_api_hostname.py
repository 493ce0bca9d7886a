"""kimi-cluster:apiHostname under Pulumi's mocks: the name clients use reaches the endpoint URLs, the client configs,
the stack's own certificate and the readiness wait; a bring-your-own certificate for it is used with its own key."""

from __future__ import annotations

import base64

from kimi_cluster.deploy import tls
from tests.deploy.test_program import config, outputs_for
from tests.pulumi_harness import dumps, run_program

HOST = "kimi.team.example.com"


def test_the_stack_serves_and_checks_the_api_hostname_and_its_certificate_names_it():
    cfg, secret = config(apiHostname=HOST)
    rec = run_program(cfg, secret, outputs_for)
    out = rec.exports
    assert out["endpoint_url"] == f"https://{HOST}:8000" and out["openai_base_url"] == f"https://{HOST}:8000/v1"
    assert out["anthropic_base_url"] == f"https://{HOST}:8000"
    assert out["head_public_ip"] == "198.51.100.10"  # the address its DNS record must point at
    assert f"https://{HOST}:8000/v1" in dumps(out["client_configs"])
    assert "198.51.100.10" not in dumps(out["client_configs"])
    [cert] = rec.of_type(":ServerCertificate")
    assert cert.values()["dns_names"] == [HOST] and cert.values()["ip_addresses"] == ["198.51.100.10"]
    [ca] = rec.of_type(":CertificateAuthority")
    assert ca.values()["permitted_dns_names"] == [HOST]  # the CA can vouch for this name only
    wait = rec.by_name["kimi-ready-wait"].script()
    assert f"BASE=https://{HOST}:8000" in wait and f"CONNECT_TO={HOST}:8000:127.0.0.1:8000" in wait


def test_without_api_hostname_nothing_changes():
    cfg, secret = config()
    rec = run_program(cfg, secret, outputs_for)
    assert rec.exports["endpoint_url"] == "https://198.51.100.10:8000"
    [cert] = rec.of_type(":ServerCertificate")
    assert cert.values()["dns_names"] == []
    [ca] = rec.of_type(":CertificateAuthority")
    assert ca.values()["permitted_dns_names"] == []


def test_an_own_certificate_for_the_api_hostname_is_served_with_its_key():
    ca, ca_key = tls.make_ca("team CA")
    leaf, leaf_key = tls.make_server_certificate(ca, ca_key, [], [HOST])
    cfg, secret = config(apiHostname=HOST, tlsCertificate=leaf + ca, tlsPrivateKey=leaf_key)
    rec = run_program(cfg, [*secret, "kimi-cluster:tlsPrivateKey"], outputs_for)
    assert rec.exports["endpoint_url"] == f"https://{HOST}:8000" and rec.exports["ca_certificate"] == ca
    assert rec.of_type(":ServerCertificate") == [] and rec.of_type(":CertificateAuthority") == []
    proxy = rec.by_name["kimi-node0-proxy"]
    assert base64.b64encode(leaf_key.encode()).decode() in proxy.values()["stdin"]
    assert leaf_key not in dumps(proxy.plain())


def test_a_key_that_is_not_the_certificates_is_refused_before_any_resource():
    import pytest

    from tests.pulumi_harness import Recording

    ca, ca_key = tls.make_ca("team CA")
    leaf, _ = tls.make_server_certificate(ca, ca_key, [], [HOST])
    cfg, secret = config(apiHostname=HOST, tlsCertificate=leaf + ca, tlsPrivateKey=tls.make_ca("other")[1])
    rec = Recording()
    with pytest.raises(Exception, match="kimi-cluster:tlsPrivateKey does not belong to the leaf"):
        run_program(cfg, [*secret, "kimi-cluster:tlsPrivateKey"], outputs_for, recording=rec)
    assert rec.resources == []
