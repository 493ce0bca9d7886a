"""Shared fixtures for the verification tests: a fake inference server per test, and import paths.
The verification stack's modules are imported by their top-level names, as Pulumi imports them.
"""

import os
import sys
from contextlib import contextmanager

import pytest
import requests

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VERIFICATION_DIR = os.path.join(REPO, "verification")
if VERIFICATION_DIR not in sys.path:
    sys.path.insert(0, VERIFICATION_DIR)

from fakes.inference_server import FakeInferenceServer, FakeSettings  # noqa: E402

MODEL = "moonshotai/Kimi-K3.1-Pro"
# Long and distinctive, so a leak shows up in any output it lands in.
KEY = "sk-test-7f3c9a1e5b2d4f6081a3c5e7"


@contextmanager
def running_fake(engine="sglang", faults=(), api_key=KEY, **extra):
    settings = FakeSettings(engine=engine, api_key=api_key, faults=frozenset(faults), **extra)
    with FakeInferenceServer(settings) as server:
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
        yield s
