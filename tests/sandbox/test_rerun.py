"""What a changed connection costs, and what a hung step does, in the sandbox as a user runs it.

pulumi-command counts a changed `connection` (here: a rotated sshPrivateKey) as an update of every remote command,
and an update re-runs `create`: the whole chain runs again on every node. On a healthy cluster that must cost
nothing: the same engine container and process, not one byte from the hub, no image pull.

A step whose tool never returns fails through the deadline the step enforces on the node
(kimi_cluster/settings/timing.py),
whatever the engine's own timeouts do.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from kimi_cluster.plan.steps.table import STEPS
from kimi_cluster.sandbox.workdir import new_ssh_private_key, ssh_public_key_of

from .conftest import hub_stats, leftover_processes, ok, report

pytestmark = [pytest.mark.flow, pytest.mark.timeout(300)]


def _nodes(workdir: Path) -> list[Path]:
    return sorted((workdir / "nodes").iterdir())


def _engine(node: Path) -> tuple[str, int]:
    """(container id, engine process id) of the node's kimi-engine."""
    fake = node / "var/lib/fake-node"
    container = json.loads((fake / "docker/containers/kimi-engine.json").read_text())
    return container["id"], int((fake / "engines/kimi-engine.pid").read_text())


def _docker_pulls(node: Path) -> int:
    calls = (node / "var/lib/fake-node/calls.jsonl").read_text().splitlines()
    return sum(1 for line in calls if (row := json.loads(line))["tool"] == "docker" and row["argv"][:1] == ["pull"])


def test_a_rotated_ssh_key_reruns_every_step_on_every_node_at_no_cost(sandbox) -> None:
    run = sandbox(kernel_cache=True)
    first = run("up", "--topology", "h100x4-sglang")
    ok(first)
    nodes = _nodes(run.workdir)
    assert len(nodes) == 4
    before_hub = hub_stats(run.workdir)
    before_engines = [_engine(n) for n in nodes]
    head = next(n for n in nodes if (n / "var/lib/fake-node/engines/kimi-proxy.pid").exists())
    proxy_pid = int((head / "var/lib/fake-node/engines/kimi-proxy.pid").read_text())
    # The first up did both; the head also pulled the proxy's image.
    pulls = [2 if n == head else 1 for n in nodes]
    assert before_hub["body_bytes"] > 0 and [_docker_pulls(n) for n in nodes] == pulls

    # The operator rotates the key as on a real cluster: the new public key goes into each VM's authorized_keys
    # first, the keypair (the VMs' creation input) keeps the old one, and sshPrivateKey changes; so does every
    # command's `connection` input.
    key_file = run.workdir / "secrets" / "ssh_private_key_ed25519"
    old_public = ssh_public_key_of(key_file.read_text())
    new_key = new_ssh_private_key()
    for node in nodes:
        with open(node / ".ssh" / "authorized_keys", "a") as keys:
            keys.write(ssh_public_key_of(new_key) + "\n")
    key_file.write_text(new_key)
    second = run("up", "--config", f"sshPublicKey={old_public}")
    out = ok(second)
    for rank in range(4):
        for step in STEPS:
            assert re.search(rf"~\s+command:remote:Command kimi-node{rank}-{step} updating", out), (rank, step)
    assert re.search(r"~\s+command:remote:Command kimi-ready-wait updating", out), out
    assert re.search(r"~\s+command:remote:Command kimi-node0-proxy updating", out), out
    # 4 x 6 steps, the head's proxy, the readiness wait, and the kernel cache's 4 restores and 1 save; nothing
    # created or replaced (the CLI's summary of the update, after its preview's).
    summary = out[out.rindex("Resources:"):]
    assert re.search(r"^\s+~ 31 updated$", summary, re.M), summary
    assert not re.search(r"created|replaced|deleted", summary.split("Duration:")[0]), summary
    # The kernel cache costs nothing either: no archive is fetched or uploaded again.
    for rank in range(4):
        assert "nothing fetched" in run.step_output(f"kimi-node{rank}-cache-restore"), rank
        assert "leaving it running" in run.step_output(f"kimi-node{rank}-launch"), rank
        assert "is already present" in run.step_output(f"kimi-node{rank}-image"), rank
    assert "nothing uploaded" in run.step_output("kimi-kernel-cache-save")
    assert "the proxy already runs with this configuration" in run.step_output("kimi-node0-proxy")

    after_hub = hub_stats(run.workdir)
    assert after_hub["body_bytes"] == before_hub["body_bytes"], "the re-run downloaded file bytes from the hub"
    assert [_engine(n) for n in nodes] == before_engines, "the re-run restarted an engine"
    assert all(Path(f"/proc/{pid}").exists() for _, pid in before_engines)
    assert [_docker_pulls(n) for n in nodes] == pulls, "the re-run pulled an image again"
    assert int((head / "var/lib/fake-node/engines/kimi-proxy.pid").read_text()) == proxy_pid

    ok(run("destroy", "--quiet"))
    assert leftover_processes(run.workdir) == []
    report(f"h100x4-sglang: up {first.seconds:.1f} s, up after a rotated sshPrivateKey {second.seconds:.1f} s "
           f"(31 steps re-run over the new key, {after_hub['requests'] - before_hub['requests']} hub metadata "
           "requests, 0 file bytes, same 4 engine processes)")


def test_a_hung_step_fails_up_through_its_own_node_side_deadline(sandbox) -> None:
    # The driver never answers: nvidia-smi hangs. Only the ready step's deadline (its floor, a minute) can end it.
    run = sandbox({"FAKE_HANG": "nvidia-smi"})
    up = run("up", "--topology", "b300x1-vllm", "--config", 'stepDeadlineMinutes={"ready": 1}')
    assert up.code == 1, up.output
    assert "kimi-cluster step ready ran out of its 60 s deadline on the node and was stopped" in up.output
    # pulumi-command's error for the resource, as the CLI printed it: the exit status the deadline gave.
    assert re.search(r"^FAILED: .*kimi-node0-ready.*Process exited with status 124", up.output, re.M), up.output
    assert "kimi-node0-storage creating" not in up.output  # nothing after the hung step ran
    ok(run("destroy", "--quiet"))
    assert leftover_processes(run.workdir) == []
    report(f"b300x1-vllm with a hung nvidia-smi: up failed through the ready step's 60 s deadline in "
           f"{up.seconds:.1f} s")
