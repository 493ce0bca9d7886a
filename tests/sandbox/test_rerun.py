"""What a changed connection costs, and what a hung step does, in the sandbox as a user runs it.

pulumi-command counts a changed `connection` (here: a rotated sshPrivateKey) as an update of every remote command,
and an update re-runs `create`: the whole chain runs again on every node. On a healthy cluster that must cost
nothing: the same engine container and process, not one byte from the hub, no image pull.

pulumi-command never stops a running command at its custom_timeouts, and the sandbox engine does not either: a step
whose tool never returns fails only through the deadline the step enforces on the node.
"""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path

import pytest

from components.steps import STEPS
from fakes.hub import STATS_PATH

from .conftest import leftover_processes, ok, report

pytestmark = [pytest.mark.flow, pytest.mark.timeout(300)]


def _hub_stats(hub_url: str) -> dict:
    with urllib.request.urlopen(hub_url + STATS_PATH, timeout=10) as answer:
        return json.loads(answer.read())


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
    hub_url = run.record()["hub_url"]
    nodes = _nodes(run.workdir)
    assert len(nodes) == 4
    before_hub = _hub_stats(hub_url)
    before_engines = [_engine(n) for n in nodes]
    head = next(n for n in nodes if (n / "var/lib/fake-node/engines/kimi-proxy.pid").exists())
    proxy_pid = int((head / "var/lib/fake-node/engines/kimi-proxy.pid").read_text())
    # The first up did both; the head also pulled the proxy's image.
    pulls = [2 if n == head else 1 for n in nodes]
    assert before_hub["body_bytes"] > 0 and [_docker_pulls(n) for n in nodes] == pulls

    # The operator rotates the key: every command's `connection` input changes.
    key_file = run.workdir / "secrets" / "ssh_private_key"
    key_file.write_text("sandbox-dummy-ssh-key-rotated\n")
    second = run("up")
    out = ok(second)
    for rank in range(4):
        for step in STEPS:
            assert re.search(rf"~ command:remote:Command kimi-node{rank}-{step} updating", out), (rank, step)
    assert "~ command:remote:Command kimi-ready-wait updating" in out
    # 4 x 6 steps, the head's proxy, the readiness wait, and the kernel cache's 4 restores and 1 save.
    assert "~ command:remote:Command kimi-node0-proxy updating" in out
    assert re.search(r"Resources: 0 created, 31 updated, 0 replaced", out), out
    # The kernel cache costs nothing either: no archive is fetched or uploaded again.
    assert out.count("nothing fetched") == 4 and "nothing uploaded" in out

    after_hub = _hub_stats(hub_url)
    assert after_hub["body_bytes"] == before_hub["body_bytes"], "the re-run downloaded file bytes from the hub"
    assert [_engine(n) for n in nodes] == before_engines, "the re-run restarted an engine"
    assert all(Path(f"/proc/{pid}").exists() for _, pid in before_engines)
    assert [_docker_pulls(n) for n in nodes] == pulls, "the re-run pulled an image again"
    assert out.count("leaving it running") == 4 and out.count("is already present") == 5
    assert "the proxy already runs with this configuration" in out
    assert int((head / "var/lib/fake-node/engines/kimi-proxy.pid").read_text()) == proxy_pid

    ok(run("destroy", "--quiet"))
    assert leftover_processes(run.workdir) == []
    report(f"h100x4-sglang: up {first.seconds:.1f} s, up after a rotated sshPrivateKey {second.seconds:.1f} s "
           f"(31 steps re-run, {after_hub['requests'] - before_hub['requests']} hub metadata requests, "
           "0 file bytes, same 4 engine processes)")


def test_a_hung_step_fails_up_through_its_own_node_side_deadline(sandbox) -> None:
    # The driver never answers: nvidia-smi hangs. Only the ready step's deadline (6 s here) can end it.
    run = sandbox({"FAKE_HANG": "nvidia-smi"})
    up = run("up", "--topology", "b300x1-vllm", "--config", 'stepDeadlineMinutes={"ready": 0.1}')
    assert up.code == 1, up.output
    assert "kimi-cluster step ready ran out of its 6 s deadline on the node and was stopped" in up.output
    assert re.search(r"FAILED: command:remote:Command 'kimi-node0-ready': create failed: create command exited "
                     r"with code 124", up.output), up.output
    assert "kimi-node0-storage creating" not in up.output  # nothing after the hung step ran
    ok(run("destroy", "--quiet"))
    assert leftover_processes(run.workdir) == []
    report(f"b300x1-vllm with a hung nvidia-smi: up failed through the ready step's 6 s deadline in {up.seconds:.1f} s")
