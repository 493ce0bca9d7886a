"""Every node's user_data, as the program produces it, passes cloud-init's own schema validator.

The program runs under Pulumi's mocks with a real ed25519 host key per node (ssh-keygen, as the NodeHostKey provider
makes them); each VM's user_data input is written to a file and checked with `cloud-init schema --config-file`, the
validator of the Debian package `cloud-init` that `.ci/run` installs. An invalid user_data makes cloud-init log a
warning and report `degraded`, and whatever it could not parse is not applied on the VM.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from kimi_cluster.deploy.vm import _HostKeyProvider
from tests.deploy.test_program import config, outputs_for
from tests.pulumi_harness import run_program

pytestmark = [pytest.mark.integration, pytest.mark.skipif(
    shutil.which("cloud-init") is None,
    reason="cloud-init's schema validator is not installed; install it with: apt-get install cloud-init",
)]


def _validate(text: str, path: Path) -> subprocess.CompletedProcess[str]:
    path.write_text(text)
    return subprocess.run(["cloud-init", "schema", "--config-file", str(path)], capture_output=True, text=True,
                          timeout=60)


def _with_real_host_keys(typ: str, name: str, inputs: dict) -> dict:
    if typ.endswith("NodeHostKey"):
        return _HostKeyProvider().create({}).outs
    return outputs_for(typ, name, inputs)


@pytest.mark.parametrize("topology,extra", [
    ("h100x4-sglang", {}),
    ("b300x1-vllm", {}),
    ("custom", {"flavor": "n3-H100x4", "nodeCount": "8", "gpusPerNode": "4", "gpuMemoryGb": "80",
                "engine": "sglang"}),
])
def test_every_nodes_user_data_passes_cloud_inits_schema(topology: str, extra: dict, tmp_path: Path) -> None:
    if shutil.which("ssh-keygen") is None:
        pytest.skip("ssh-keygen (OpenSSH) is needed to make the host keys, as on the machine that runs pulumi up")
    cfg, secret = config(topology=topology, **extra)
    recording = run_program(cfg, secret, _with_real_host_keys)
    vms = recording.of_type(":VirtualMachine")
    assert vms, "the program registered no VM"
    for vm in vms:
        user_data = vm.values()["user_data"]
        assert "ed25519_private: |" in user_data  # the pinned host key really is in it
        done = _validate(user_data, tmp_path / f"{vm.name}.yaml")
        assert done.returncode == 0, f"{vm.name}: {done.stdout}{done.stderr}"
        assert "Valid cloud-config" in done.stdout


def test_the_validator_rejects_an_empty_ssh_genkeytypes(tmp_path: Path) -> None:
    # What the program used to produce: proves the check above can fail.
    done = _validate("#cloud-config\nssh_deletekeys: true\nssh_genkeytypes: []\n", tmp_path / "old.yaml")
    assert done.returncode != 0 and "ssh_genkeytypes" in done.stdout + done.stderr
