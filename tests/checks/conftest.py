"""Shared fixtures for the verification tests: a fake inference server per test, and import paths.
The verification stack's modules are imported by their top-level names, as Pulumi imports them.
"""

import os
import sys
from contextlib import contextmanager

import pytest
import requests

from kimi_cluster.deploy import tls
from kimi_cluster.fakes.head import ProxiedEngine
from kimi_cluster.fakes.inference.server import FakeInferenceServer
from kimi_cluster.fakes.inference.settings import FakeSettings

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VERIFICATION_DIR = os.path.join(REPO, "verification")
if VERIFICATION_DIR not in sys.path:
    sys.path.insert(0, VERIFICATION_DIR)

MODEL = "moonshotai/Kimi-K3.1-Pro"
# Long and distinctive, so a leak shows up in any output it lands in.
KEY = "sk-test-7f3c9a1e5b2d4f6081a3c5e7"


_TLS: dict[str, str] = {}


def tls_material() -> dict[str, str]:
    """One CA and a certificate for 127.0.0.1 per test session, as the cluster makes them
    (kimi_cluster/deploy/tls.py)."""
    if not _TLS:
        import tempfile

        ca, ca_key = tls.make_ca("verifier tests CA")
        cert, key = tls.make_server_certificate(ca, ca_key, ["127.0.0.1"])
        d = tempfile.mkdtemp(prefix="kimi-verify-tls-")
        for name, text in (("ca.pem", ca), ("cert.pem", cert), ("key.pem", key)):
            with open(os.path.join(d, name), "w") as fh:
                fh.write(text)
        _TLS.update(ca=ca, ca_key=ca_key, ca_file=os.path.join(d, "ca.pem"), cert_file=os.path.join(d, "cert.pem"),
                    key_file=os.path.join(d, "key.pem"))
    return _TLS


@contextmanager
def running_fake(engine="sglang", faults=(), api_key=KEY, tls_on=True, proxied=None, **extra):
    """A fake endpoint serving https (server.url, server.ca_certificate). By default it is the endpoint as the cluster
    serves it: the real proxy with the product's configuration in front of a keyless engine (both engines serve
    /metrics, and vLLM /invocations, without their key). `proxied=False`, or the no_auth fault, is the engine alone
    with its own key, over TLS with the session's CA."""
    if proxied is None:
        proxied = api_key is not None and "no_auth" not in faults and tls_on
    if proxied:
        material = tls_material()
        with ProxiedEngine(FakeSettings(engine=engine, faults=frozenset(faults), **extra), api_key=api_key,
                           ca=(material["ca"], material["ca_key"])) as head:
            yield head
        return
    settings = FakeSettings(engine=engine, api_key=api_key, faults=frozenset(faults), **extra)
    material = tls_material() if tls_on else None
    with FakeInferenceServer(settings, tls=(material["cert_file"], material["key_file"]) if material else None,
                             ca_certificate=material["ca"] if material else None) as server:
        yield server


@pytest.fixture
def fake():
    """Factory: `with fake(engine="vllm", faults=["slow"]) as server: server.url`."""
    return running_fake


@pytest.fixture
def session():
    # no proxy from the environment may sit between the tests and their loopback servers
    with requests.Session() as s:
        s.trust_env = False
        s.verify = tls_material()["ca_file"]
        yield s
