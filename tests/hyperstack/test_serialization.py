"""What reaches Pulumi state: the pickled providers and the resources' inputs carry no credential.

A pickled provider is run in a fresh interpreter, configured the way the dynamic provider host configures it.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path

import pulumi
import pytest
from pulumi.dynamic import Config, ConfigureRequest
from pulumi.dynamic.dynamic import serialize_provider

from kimi_cluster.deploy.hyperstack_providers import providers
from kimi_cluster.deploy.hyperstack_providers.resources import Environment, Keypair, SecurityRule, VirtualMachine
from tests.hyperstack.conftest import FLAVOR, IMAGE, PUBLIC_KEY, vm_props

REPO = Path(__file__).resolve().parents[2]
PROVIDER_CLASSES = (providers.EnvironmentProvider, providers.KeypairProvider, providers.VirtualMachineProvider,
                    providers.SecurityRuleProvider)

# Runs in a new interpreter with no HYPERSTACK_* variables: the stdin message plays the engine's Configure call.
CHILD = """
import base64, json, sys
import dill
from pulumi.dynamic import Config, ConfigureRequest
from kimi_cluster.hyperstack_api.api import HyperstackError

msg = json.load(sys.stdin)
provider = dill.loads(base64.b64decode(msg["provider"]))
try:
    provider.create(msg["props"])
    sys.exit("created without credentials: something was captured")
except HyperstackError as err:
    assert err.error_reason == "missing_api_key", err
provider.configure(ConfigureRequest(Config(msg["config"], "kimi-cluster")))
created = provider.create(msg["props"])
provider.delete(created.id, created.outs)
print(json.dumps({"id": created.id, "status": created.outs["status"]}))
"""


@pytest.mark.timeout(60)
def test_a_pickled_provider_creates_and_deletes_from_a_fresh_process(base, monkeypatch):
    secret = "sk-only-in-config-and-env"
    base.add_api_key(secret)
    # Make the key visible to this process every way a program could see it, then pickle.
    monkeypatch.setenv("HYPERSTACK_API_KEY", secret)
    providers.VirtualMachineProvider().configure(
        ConfigureRequest(Config({"hyperstack:apiKey": secret, "hyperstack:apiUrl": base.base_url}, "kimi-cluster")))
    blobs = {cls.__name__: serialize_provider(cls()) for cls in PROVIDER_CLASSES}
    for name, blob in blobs.items():
        raw = base64.b64decode(blob)
        assert secret not in blob and secret.encode() not in raw, name
        assert base.base_url.encode() not in raw, name  # no config of any kind travels with the provider

    child_env = {k: v for k, v in os.environ.items() if not k.startswith("HYPERSTACK_")}
    message = {"provider": blobs["VirtualMachineProvider"], "props": vm_props(),
               "config": {"hyperstack:apiKey": secret, "hyperstack:apiUrl": base.base_url,
                          "hyperstack:retryBaseSeconds": "0.005"}}
    done = subprocess.run([sys.executable, "-c", CHILD], input=json.dumps(message), capture_output=True, text=True,
                          cwd=REPO, env=child_env, timeout=50)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["status"] == "ACTIVE"
    assert [r.status for r in base.calls("POST", "/core/virtual-machines")] == [200]
    assert base.inventory()["virtual_machines"] == []


class RecordingMocks(pulumi.runtime.Mocks):
    def __init__(self) -> None:
        self.resources: list[pulumi.runtime.MockResourceArgs] = []

    def new_resource(self, args: pulumi.runtime.MockResourceArgs):
        self.resources.append(args)
        outputs = dict(args.inputs)
        outputs.update({"environment_id": "1", "keypair_id": "2", "vm_id": "3", "rule_id": "4",
                        "public_ip": "127.0.0.2", "private_ip": "127.0.0.2", "status": "ACTIVE",
                        "fingerprint": "ff:00"})
        return f"{args.name}-id", outputs

    def call(self, args: pulumi.runtime.MockCallArgs):
        return {}


SECRET = "sk-must-not-reach-state-0f9e8d"


@pytest.mark.timeout(30)
def test_resources_register_typed_inputs_without_credentials(monkeypatch):
    # Mocks are process-wide: install them here, not at import, so other modules' mocks are not overwritten.
    mocks = RecordingMocks()
    pulumi.runtime.set_mocks(mocks, project="kimi-cluster", stack="test", preview=False)
    monkeypatch.setitem(pulumi.runtime.config.CONFIG.get(), "hyperstack:apiKey", SECRET)
    monkeypatch.setenv("HYPERSTACK_API_KEY", SECRET)

    @pulumi.runtime.test
    def program():
        env = Environment("env", name="kimi-env", region="CANADA-1")
        key = Keypair("key", name="kimi-key", environment_name=env.name, public_key=PUBLIC_KEY)
        vm = VirtualMachine("node-0", name="kimi-node-0", environment_name=env.name, region="CANADA-1",
                            flavor_name=FLAVOR, image_name=IMAGE, key_name=key.name, labels=["kimi-cluster"])
        rule = SecurityRule("node-0-ssh", vm_id=vm.vm_id, remote_ip_prefix="203.0.113.7/32", port_range_min=22,
                            port_range_max=22)
        outputs = (vm.vm_id, vm.public_ip, rule.rule_id, key.fingerprint, env.environment_id)
        return pulumi.Output.all(*outputs).apply(lambda values: check(mocks, values))

    program()
    assert len(mocks.resources) == 4


def check(mocks: RecordingMocks, values: list) -> None:
    assert values == ["3", "127.0.0.2", "4", "ff:00", "1"]
    types = sorted(r.typ for r in mocks.resources)
    assert types == sorted(f"pulumi-python:dynamic/hyperstack:{t}"
                           for t in ("Environment", "Keypair", "VirtualMachine", "SecurityRule"))
    for registered in mocks.resources:
        inputs = dict(registered.inputs)
        provider_blob = inputs.pop("__provider")
        if isinstance(provider_blob, dict):  # marked secret: the mocks see the wire form of a secret
            provider_blob = provider_blob["value"]
        assert SECRET not in json.dumps(inputs, default=str), registered.typ
        assert SECRET.encode() not in base64.b64decode(provider_blob), registered.typ
        assert not any("key" in k.lower() and k not in ("key_name", "public_key") for k in inputs), inputs
    vm_inputs = next(r.inputs for r in mocks.resources if r.typ.endswith("VirtualMachine"))
    assert vm_inputs["labels"] == ["kimi-cluster"] and vm_inputs["assign_floating_ip"] is True
    assert (vm_inputs["environment_name"], vm_inputs["key_name"]) == ("kimi-env", "kimi-key")  # outputs wire up
    rule_inputs = next(r.inputs for r in mocks.resources if r.typ.endswith("SecurityRule"))
    assert rule_inputs["vm_id"] == "3" and rule_inputs["direction"] == "ingress" and rule_inputs["protocol"] == "tcp"
