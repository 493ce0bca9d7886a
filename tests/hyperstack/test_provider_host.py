"""Pulumi's own dynamic provider host imports the providers through the project's install, from any directory.

The host (`python -m pulumi.dynamic`) unpickles each provider by module name. Under the Pulumi CLI it starts in the
project directory, and only `-m` puts that directory on sys.path; here it starts in an empty temporary directory
with PYTHONSAFEPATH=1 (no cwd on sys.path at all) and no PYTHONPATH, so only `pip install -e .` can make the imports
work. It is driven over gRPC through Configure, Check, Create and Delete of a VM against the emulator.
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from pulumi.dynamic.dynamic import serialize_provider

from components.hyperstack import providers
from fakes.hyperstack_emulator import DEFAULT_API_KEY, Emulator
from sandbox.config import StackConfig
from sandbox.console import Console
from sandbox.dynamic_host import DynamicProviderHost
from sandbox.providers import Call, ProviderError
from tests.hyperstack.conftest import env_props, keypair_props, vm_props

pytestmark = pytest.mark.timeout(120)

VM_TYPE = "pulumi-python:dynamic:Resource"
URN = "urn:pulumi:dev::kimi-cluster::hyperstack:index:VirtualMachine::kimi-node0"


@pytest.fixture
def host_in_tmp(emu: Emulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    # What the host process inherits: no cwd on sys.path, no PYTHONPATH, no credential in the environment.
    monkeypatch.setenv("PYTHONSAFEPATH", "1")
    monkeypatch.delenv("PYTHONPATH", raising=False)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    config = StackConfig(
        values={"hyperstack:apiUrl": emu.base_url, "hyperstack:apiKey": DEFAULT_API_KEY,
                "hyperstack:retryBaseSeconds": "0.005"},
        secret_keys=frozenset({"hyperstack:apiKey"}),
    )
    out = io.StringIO()
    host = DynamicProviderHost(elsewhere, "kimi-cluster", "dev", config, Console(out))
    host.start()
    yield host, out
    host.close()


def test_the_real_host_runs_a_vm_lifecycle_from_a_temporary_directory_with_safe_path(emu, host_in_tmp) -> None:
    host, out = host_in_tmp
    # The VM needs its environment and keypair: made in this process, after the host started without them.
    emu_env = {"HYPERSTACK_API_URL": emu.base_url, "HYPERSTACK_API_KEY": DEFAULT_API_KEY}
    with pytest.MonkeyPatch.context() as mp:
        for key, value in emu_env.items():
            mp.setenv(key, value)
        providers.EnvironmentProvider().create(env_props())
        providers.KeypairProvider().create(keypair_props())
    emu.clear_requests()

    inputs = {"__provider": serialize_provider(providers.VirtualMachineProvider()), **vm_props()}
    call = Call(URN, VM_TYPE, "kimi-node0", timeout=60)
    checked = host.check(call, {}, inputs)  # Configure runs first, on connect
    vm_id, outputs = host.create(call, checked)
    assert outputs["status"] == "ACTIVE" and outputs["public_ip"]
    assert [vm["name"] for vm in emu.inventory()["virtual_machines"]] == ["kimi-node-0"]
    # The credentials came through Configure only: the host's environment has none.
    assert all(r.status != 401 for r in emu.calls("POST", "/core/virtual-machines"))

    host.delete(Call(URN, VM_TYPE, "kimi-node0", id=vm_id, timeout=60), checked, outputs)
    assert emu.inventory()["virtual_machines"] == []
    assert "ModuleNotFoundError" not in out.getvalue()


def test_the_real_host_imports_the_verification_provider_from_a_temporary_directory(host_in_tmp) -> None:
    import checks_resource

    host, _ = host_in_tmp
    inputs = {"__provider": serialize_provider(checks_resource.VerificationProvider()),
              "endpoint_url": "", "served_model_name": "m", "only": ["models", "astrology"]}
    call = Call("urn:pulumi:dev::kimi-cluster-verification::kimi-verification:index:EndpointVerification::v",
                VM_TYPE, "v", timeout=60)
    # The provider's own check ran in the host (an import failure would be a ModuleNotFoundError instead).
    with pytest.raises(ProviderError, match=r"endpoint_url: .*only: "):
        host.check(call, {}, inputs)
