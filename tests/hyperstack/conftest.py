"""Fixtures for the Hyperstack tests: a fast emulator on loopback and an environment pointing the client at it.

Lifecycle phases last milliseconds so the whole suite stays well under a minute.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import pytest

from kimi_cluster.deploy.hyperstack_providers import providers
from kimi_cluster.fakes.hyperstack_emulator.emulator import DEFAULT_API_KEY, Emulator
from kimi_cluster.fakes.hyperstack_emulator.state import Lifecycle

FAST = Lifecycle(creating_seconds=0.05, build_seconds=0.05, floating_ip_seconds=0.03, deleting_seconds=0.05)
REGION = "CANADA-1"
FLAVOR = "n3-H100x8-NVLink"
IMAGE = "Ubuntu Server 24.04 LTS R570 CUDA 12.8 with Docker"
# A syntactically valid ed25519 public key (32 bytes of key material); it opens nothing.
PUBLIC_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGtpbWktY2x1c3Rlci10ZXN0LWtleS1ub3QtcmVhbCEh test@kimi"


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No test sees another's stack config or a developer's real Hyperstack credentials."""
    for name in ("HYPERSTACK_API_URL", "HYPERSTACK_API_KEY", "HYPERSTACK_RETRY_BASE_SECONDS"):
        monkeypatch.delenv(name, raising=False)
    providers._HOST_CONFIG.clear()
    yield
    providers._HOST_CONFIG.clear()


@pytest.fixture
def emu() -> Iterator[Emulator]:
    with Emulator(lifecycle=dataclasses.replace(FAST)) as emulator:  # a copy: tests may slow one phase
        yield emulator


@pytest.fixture
def hs(emu: Emulator, monkeypatch: pytest.MonkeyPatch) -> Emulator:
    """The emulator, with HYPERSTACK_* pointing the providers at it and millisecond backoff."""
    monkeypatch.setenv("HYPERSTACK_API_URL", emu.base_url)
    monkeypatch.setenv("HYPERSTACK_API_KEY", DEFAULT_API_KEY)
    monkeypatch.setenv("HYPERSTACK_RETRY_BASE_SECONDS", "0.005")
    return emu


def env_props(name: str = "kimi-env", **extra: Any) -> dict[str, Any]:
    return {"name": name, "region": REGION, "delete_timeout_seconds": 3, "poll_interval_seconds": 0.01, **extra}


def keypair_props(name: str = "kimi-key", environment_name: str = "kimi-env", **extra: Any) -> dict[str, Any]:
    return {"name": name, "environment_name": environment_name, "public_key": PUBLIC_KEY, **extra}


def vm_props(name: str = "kimi-node-0", **extra: Any) -> dict[str, Any]:
    return {
        "name": name, "environment_name": "kimi-env", "region": REGION, "flavor_name": FLAVOR,
        "image_name": IMAGE, "key_name": "kimi-key", "labels": ["kimi-cluster", "stack-test"],
        "user_data": "#cloud-config\n{}\n", "assign_floating_ip": True, "create_timeout_seconds": 3,
        "poll_interval_seconds": 0.01, "delete_timeout_seconds": 3, **extra,
    }


def rule_props(vm_id: str, **extra: Any) -> dict[str, Any]:
    return {"vm_id": vm_id, "direction": "ingress", "protocol": "tcp", "ethertype": "IPv4",
            "remote_ip_prefix": "203.0.113.7/32", "port_range_min": 22, "port_range_max": 22, **extra}


@pytest.fixture
def base(hs: Emulator) -> Emulator:
    """An environment and a keypair already in place, made through the providers."""
    providers.EnvironmentProvider().create(env_props())
    providers.KeypairProvider().create(keypair_props())
    hs.clear_requests()
    return hs
