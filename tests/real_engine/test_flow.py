"""The README's sandbox flow under the real Pulumi CLI: up (with its preview), the firewall the program built, verify
through a real StackReference, destroy, and nothing left: not in the emulator, the stacks, the namespaces or the
bridge.

Each VM is a network namespace with Debian's sshd (fakes/node_fabric.py): pulumi-command reaches it with the
connection the program builds, pinned to the host key the program put in the VM's user_data.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fakes.node_fabric import Fabric, FabricConfig
from tests.sandbox.conftest import leftover_processes, ok, report
from tests.sandbox.test_flow import CHECKS

pytestmark = [pytest.mark.flow, pytest.mark.timeout(600)]


def _connects(namespace: str | None, host: str, port: int, timeout: float = 1.5) -> bool:
    """Whether a TCP connection to host:port completes from this machine (None) or from inside a namespace."""
    probe = f"import socket; socket.create_connection(({host!r}, {port}), timeout={timeout}).close()"
    argv = [sys.executable, "-c", probe]
    if namespace:
        argv = ["ip", "netns", "exec", namespace, *argv]
    return subprocess.run(argv, capture_output=True, timeout=30).returncode == 0


def _secrets(workdir: Path) -> list[str]:
    """Every secret the sandbox holds, whole and by its longest line (a PEM's body lines would do as well)."""
    found = []
    for path in (workdir / "secrets").rglob("*"):
        if path.is_file() and path.suffix not in (".crt",):
            text = path.read_text().strip()
            if text:
                found.append(max(text.splitlines(), key=len))
    return found


def test_up_firewall_verify_destroy_under_the_real_cli(real_sandbox) -> None:
    run = real_sandbox()
    started = time.monotonic()

    up = run("up", "--topology", "h100x4-sglang")
    out = ok(up)
    assert "under the Pulumi CLI" in out and "Previewing update (sandbox)" in out, out
    assert re.search(r"^  api_key +\[secret\]$", out, re.M), out
    head = re.search(r"^  head_public_ip +(10\.213\.\d+\.\d+)$", out, re.M).group(1)
    record = run.record()

    # The checkpoint is the CLI's own, with pulumi-command's provider and no secret in plain text.
    checkpoint = next((run.workdir / "state/.pulumi/stacks/kimi-cluster").glob("sandbox.json"))
    text = checkpoint.read_text()
    latest = json.loads(text)["checkpoint"]["latest"]
    version = latest["manifest"]["version"]
    assert tuple(int(x) for x in version.lstrip("v").split(".")) >= (3, 259, 0), version
    types = {r["type"] for r in latest["resources"]}
    assert {"pulumi:providers:command", "command:remote:Command", "pulumi-python:dynamic/hyperstack:VirtualMachine",
            "pulumi-python:dynamic/hyperstack:SecurityRule"} <= types
    leaked = [s[:12] for s in _secrets(run.workdir) if s in text]
    assert leaked == [], f"secrets in plain text in the checkpoint: {leaked}"
    # The checkout's stack file was only read: the CLI wrote its salt and secrets into the workdir's project.
    assert "encryptionsalt" not in (Path(__file__).resolve().parents[2] / "Pulumi.sandbox.yaml").read_text()

    # The security rules, as nftables in each VM's namespace (default drop).
    fabric = Fabric(FabricConfig.load(run.workdir / "fabric.json"))
    api_port, engine_port, peer_port = record["api_port"], record["engine_port"], record["peer_port"]
    node1 = str(fabric.config.network.network_address + 3)
    stranger = fabric.attach(str(fabric.config.network.network_address + 200))
    listener = subprocess.Popen(["ip", "netns", "exec", fabric.config.namespace(head), sys.executable, "-m",
                                 "http.server", str(peer_port), "--bind", head], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while not _connects(fabric.config.namespace(node1), head, peer_port):
            assert time.monotonic() < deadline, "a peer does not reach the head's peer port"
            time.sleep(0.2)
        assert _connects(None, head, 22) and _connects(None, head, api_port)  # the operator: SSH and the API
        assert not _connects(None, head, peer_port)  # the operator is no peer
        assert not _connects(stranger, head, 22)
        assert not _connects(stranger, head, api_port)
        assert not _connects(stranger, head, peer_port)
        # The engine listens on the head's loopback only: its proxy reaches it, nothing from outside does.
        assert not _connects(None, head, engine_port) and not _connects(stranger, head, engine_port)
    finally:
        listener.kill()
        listener.wait(10)
        fabric.end_namespace(stranger)

    verify = run("verify")
    out = ok(verify)
    for check in CHECKS:
        assert any(line.split()[:2] == [check, "PASS"] for line in out.splitlines()), out
    ref = run.workdir / "state/.pulumi/stacks/kimi-cluster-verification/sandbox.json"
    refs = [r for r in json.loads(ref.read_text())["checkpoint"]["latest"]["resources"]
            if r["type"] == "pulumi:pulumi:StackReference"]
    assert [r["inputs"]["name"] for r in refs] == ["organization/kimi-cluster/sandbox"]

    destroy = run("destroy")
    out = ok(destroy)
    assert "emulator: nothing left" in out and "removed the fake nodes' network" in out, out
    assert not (run.workdir / "state/.pulumi/stacks/kimi-cluster/sandbox.json").exists()
    assert fabric.namespaces() == [] and not fabric.bridge_up()
    assert leftover_processes(run.workdir) == []
    report(f"h100x4-sglang (real Pulumi CLI): up {up.seconds:.1f} s, verify {verify.seconds:.1f} s, "
           f"destroy {destroy.seconds:.1f} s, whole flow {time.monotonic() - started:.1f} s")
