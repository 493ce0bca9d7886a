"""The whole sandbox flow per topology, as a user runs it: up (with its preview), verify through a real
StackReference, destroy, and nothing left: not in the emulator, the stacks, the namespaces or the bridge.

Each VM is a network namespace with Debian's sshd (kimi_cluster/fakes/node_fabric.py): pulumi-command reaches it with
the
connection the program builds, pinned to the host key the program put in the VM's user_data. The h100x4-sglang flow
also checks the firewall the program built (nftables in each namespace, default drop) and the real CLI's checkpoint;
b300x1-vllm runs exactly the README's commands (the sandbox line of "Two commands for a newcomer").
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kimi_cluster.fakes import sandbox_services as services

from .conftest import CHECKPOINT, REPO_ROOT, leftover_processes, ok, report

pytestmark = [pytest.mark.flow, pytest.mark.timeout(600)]

CHECKS = ("tls", "models", "auth", "chat", "effort", "preserved_thinking", "tool_calls", "image", "anthropic",
          "stream", "clients")


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



def _verified(output: str) -> None:
    for check in CHECKS:
        assert any(line.split()[:2] == [check, "PASS"] for line in output.splitlines()), output
    assert "sandbox verify: PASSED" in output


def test_h100_flow_firewall_checkpoint_and_a_dead_engine(sandbox) -> None:
    run = sandbox(timeline=True, kernel_cache=True, preview=True)
    started = time.monotonic()

    up = run("up", "--topology", "h100x4-sglang")
    out = ok(up)
    assert "under the Pulumi CLI" in out and "Previewing update (sandbox)" in out, out
    assert re.search(r"^  api_key +\[secret\]$", out, re.M), out
    head = re.search(r"^  head_public_ip +(10\.213\.\d+\.\d+)$", out, re.M).group(1)
    assert re.search(rf"^  endpoint_url +https://{re.escape(head)}:\d+$", out, re.M), out
    emulator = run.emulator()
    inventory = emulator.inventory()
    assert sorted(vm["name"] for vm in inventory["virtual_machines"]) == [f"kimi-sandbox-node{r}" for r in range(4)]
    assert {vm["status"] for vm in inventory["virtual_machines"]} == {"ACTIVE"}
    assert emulator.vm_posts() == 4
    # Every rank runs an engine; only the head serves HTTP, behind the real proxy, and readiness passed through it.
    engines = list(run.workdir.glob("nodes/*/var/lib/fake-node/engines/kimi-engine.pid"))
    assert len(engines) == 4
    assert [p.parts[-6] for p in run.workdir.glob("nodes/*/var/lib/fake-node/engines/kimi-proxy.pid")] == [head]
    # The nodes shared the download over their private addresses, and up drew the bring-up.
    weights_log = run.workdir.joinpath(f"nodes/{head}/var/log/kimi-cluster/weights.log").read_text()
    assert "sharing with 3 peers" in weights_log and "nothing is listening any more" in weights_log
    assert run.workdir.joinpath("timeline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert re.search(r"^timeline: .*timeline\.png \(\d+ steps on 4 nodes\)$", out, re.M), out

    # The checkpoint is the CLI's own, with pulumi-command's provider and no secret in plain text.
    text = (run.workdir / CHECKPOINT).read_text()
    latest = json.loads(text)["checkpoint"]["latest"]
    version = latest["manifest"]["version"]
    assert tuple(int(x) for x in version.lstrip("v").split(".")) >= (3, 259, 0), version
    types = {r["type"] for r in latest["resources"]}
    assert {"pulumi:providers:command", "command:remote:Command", "pulumi-python:dynamic/hyperstack:VirtualMachine",
            "pulumi-python:dynamic/hyperstack:SecurityRule"} <= types
    leaked = [s[:12] for s in _secrets(run.workdir) if s in text]
    assert leaked == [], f"secrets in plain text in the checkpoint: {leaked}"
    # The checkout's stack file was only read: the CLI wrote its salt and secrets into the workdir's project.
    assert "encryptionsalt" not in (REPO_ROOT / "Pulumi.sandbox.yaml").read_text()

    _check_the_firewall(run, head)

    verify = run("verify")
    _verified(ok(verify))
    ref = run.workdir / "state/.pulumi/stacks/kimi-cluster-verification/sandbox.json"
    refs = [r for r in json.loads(ref.read_text())["checkpoint"]["latest"]["resources"]
            if r["type"] == "pulumi:pulumi:StackReference"]
    assert [r["inputs"]["name"] for r in refs] == ["organization/kimi-cluster/sandbox"]

    # The head's engine dies: verify says so and exits non-zero.
    head_engine = int(run.workdir.joinpath(f"nodes/{head}/var/lib/fake-node/engines/kimi-engine.pid").read_text())
    assert services.terminate([head_engine], timeout=10) == []
    broken = run("verify")
    assert broken.code == 1, broken.output
    assert "sandbox verify: FAILED" in broken.output and "models" in broken.output

    fabric = run.fabric()
    destroy = run("destroy")
    out = ok(destroy)
    assert "emulator: nothing left" in out and "removed the fake nodes' network" in out, out
    elapsed = time.monotonic() - started
    assert not (run.workdir / CHECKPOINT).exists()
    assert fabric.namespaces() == [] and not fabric.bridge_up()
    assert leftover_processes(run.workdir) == []
    report(f"h100x4-sglang: up {up.seconds:.1f} s, verify {verify.seconds:.1f} s, destroy {destroy.seconds:.1f} s, "
           f"whole flow {elapsed:.1f} s")


def _check_the_firewall(run, head: str) -> None:
    """The security rules, as nftables in each VM's namespace (default drop): the operator reaches SSH and the API
    port, only a peer the peer port, and nothing from outside the engine's port."""
    fabric = run.fabric()
    record = run.record()
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
        # A VM gone silent (`reclaim --mode unreachable`): what reached it a moment ago reaches it no more.
        address = str(fabric.config.network.network_address + 200)
        served = subprocess.Popen(["ip", "netns", "exec", stranger, sys.executable, "-m", "http.server", "8080",
                                   "--bind", address], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 10
            while not _connects(None, address, 8080):
                assert time.monotonic() < deadline, "the stranger's server does not listen"
                time.sleep(0.2)
            fabric.isolate(address)
            assert not _connects(None, address, 8080) and not _connects(fabric.config.namespace(head), address, 8080)
        finally:
            served.kill()
            served.wait(10)
    finally:
        listener.kill()
        listener.wait(10)
        fabric.end_namespace(stranger)


def test_b300_flow_with_its_own_services_and_reruns(sandbox) -> None:
    run = sandbox(kernel_cache=True)
    started = time.monotonic()

    up = run("up", "--topology", "b300x1-vllm")
    out = ok(up)
    assert "started the Hyperstack emulator" in out and "started the fake Hugging Face hub" in out
    assert "timeline:" not in out and not run.workdir.joinpath("timeline.png").exists()  # --no-timeline
    record = run.record()
    service_pids = {name: data["pid"] for name, data in record["services"].items()}
    assert set(service_pids) == {"emulator", "hub", "kernel-store"}
    # The hub answers only with the stack's hfToken: a finished download proves the token reached the node on stdin.
    token_file = run.workdir / "secrets" / "hf_token"
    assert str(token_file) in " ".join(services._cmdline(service_pids["hub"]))
    assert token_file.read_text().strip() not in " ".join(services._cmdline(service_pids["hub"]))

    again = run("up")  # the recorded topology; everything is already there
    assert re.search(r"ready in [\d.]+ s .*; 0 created, \d+ unchanged", ok(again)), again.output

    verify = run("verify")
    _verified(ok(verify))

    destroy = run("destroy")
    out = ok(destroy)
    # The VM's deletion ended its namespace, and with it the vLLM engine the docker stub started.
    assert "emulator: nothing left" in out and "removed the fake nodes' network" in out, out
    elapsed = time.monotonic() - started
    assert not any(services._alive(pid) for pid in service_pids.values())
    assert leftover_processes(run.workdir) == []
    assert not (run.workdir / "sandbox.json").exists()

    assert "nothing deployed" in ok(run("destroy"))
    report(f"b300x1-vllm (own services): up {up.seconds:.1f} s, second up {again.seconds:.1f} s, "
           f"verify {verify.seconds:.1f} s, destroy {destroy.seconds:.1f} s, whole flow {elapsed:.1f} s")


def test_tokenspeed_flow_needs_the_users_image_then_serves_behind_its_gateways_shape(sandbox) -> None:
    run = sandbox()
    refused = run("up", "--topology", "b300x1-tokenspeed")
    assert refused.code != 0 and "kimi-cluster:image is required with TokenSpeed" in refused.output, refused.output
    # Refused by the settings before anything was started, let alone created.
    assert "emulator_url" not in run.record() and not run.resources()

    up = run("up", "--topology", "b300x1-tokenspeed", "--config", "image=lightseekorg/tokenspeed:0.1.1")
    out = ok(up)
    assert re.search(r"^  engine +tokenspeed$", out, re.M), out

    verify = run("verify")
    _verified(ok(verify))
    assert "owned_by tokenspeed" in verify.output and "reasoning_content" in verify.output

    # /metrics is the gateway's own listener, reached through the proxy: status prices the streamed tokens.
    text = ok(run("status", "--json"))
    report_json = json.loads(text[text.index("{"):])
    assert report_json["endpoint"]["requests"] > 0 and report_json["token_cost"]["output_tokens"] > 0

    destroy = run("destroy")
    assert "emulator: nothing left" in ok(destroy)
    assert leftover_processes(run.workdir) == []
    report(f"b300x1-tokenspeed: up {up.seconds:.1f} s, verify {verify.seconds:.1f} s, destroy {destroy.seconds:.1f} s")
