"""`status` against the sandbox, as a user runs it: in the middle of an `up` (the download in progress, with a
percentage), after it (serving), and with a node whose download stalled or whose engine is crash-looping.

The nodes are read over OpenSSH with the stack's pinned host keys, as on a real cluster, from the stack's export
(`pulumi stack export --show-secrets`). The progress file is the weights step's contract (kimi_cluster/node/weights.py
PROGRESS_FILE); this test writes one where the node's weights program keeps it.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from kimi_cluster.fakes.hub import RELEASE_PATH
from kimi_cluster.node.weights import PROGRESS_FILE
from kimi_cluster.sandbox.kimi import Sandbox

from .conftest import hub_stats, ok, report, wait_for

pytestmark = [pytest.mark.flow, pytest.mark.timeout(400)]


def _node_dir(workdir: Path) -> Path:
    return next((workdir / "nodes").iterdir())


def _progress(node: Path, done: int, total: int, updated_at: float) -> None:
    path = node / "ephemeral" / PROGRESS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"bytes_done": done, "bytes_total": total, "files_done": 1, "files_total": 3,
                               "updated_at": updated_at, "hub_bytes": done, "peer_bytes": 0}))
    os.replace(tmp, path)


def _sigint_as_a_terminal_leaves_it() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _status(run, *args: str) -> str:
    return ok(run("status", *args, timeout=120))


def test_status_mid_up_after_up_and_when_stuck(sandbox) -> None:
    # The hub holds every file body at its middle (kimi_cluster/fakes/hub_hold.py) until this test has seen the
    # weights step mid-way, then releases them: a condition, where a slow hub's rate was a guess at how long a loaded
    # machine takes to look (the download ended first, and "step" named the step after it).
    run = sandbox(hub_args="--hold")
    started = time.monotonic()
    driver = run.start("up", "--topology", "b300x1-vllm", "--quiet")
    try:
        node = wait_for("the weights step on the node", lambda: (run.workdir / "nodes").exists() and any(
            (d / ".kimi-cluster" / "weights.sh").exists() for d in (run.workdir / "nodes").iterdir())
            and _node_dir(run.workdir), 120)
        wait_for("the download to start", lambda: (node / "ephemeral/hf/hub").exists(), 60)
        wait_for("a download held at its middle by the hub", lambda: hub_stats(run.workdir)["held"] > 0, 120,
                 interval=0.5)
        def mid_up() -> tuple[dict[str, Any], str] | None:
            # The node's own weights program rewrites the same progress file as it goes, so on a loaded machine it
            # can overwrite this one before status reads it: write it again until a status sees it (a condition,
            # not a guess of how long the program takes between writes).
            _progress(node, 600_000, 1_000_000, time.time())
            found = json.loads(_status(run, "--json"))
            weights = found["nodes"][0]["weights"] or {}
            if weights.get("percent") is None:
                return None
            _progress(node, 600_000, 1_000_000, time.time())
            text = _status(run)
            return (found, text) if "%" in text else None

        mid, text = wait_for("a status mid-download that shows its percentage", mid_up, 120, interval=0.5)
        (vm,) = mid["nodes"]
        assert vm["vm"]["status"] == "ACTIVE" and "weights" in vm["step"]
        assert 0 <= vm["weights"]["percent"] <= 100
        assert mid["endpoint"]["ready_output"] is False and mid["hourly_cost_usd"] == 59.2
        assert "%" in text and "readiness not passed yet" in text
        assert hub_stats(run.workdir, RELEASE_PATH) == {"holding": False}
        out, _ = driver.communicate(timeout=300)
        assert driver.returncode == 0, out
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)

    secrets = [(run.workdir / "secrets" / name).read_text().strip() for name in ("hf_token", "hyperstack_api_key")]
    # up --no-kernel-cache (the runner's default): no bucket, no cache step.
    assert "kernel-store" not in run.record()["services"]
    assert not [r["urn"] for r in run.resources() if "cache" in r["urn"].rsplit("::", 1)[-1]]
    secrets.append(run.outputs()["api_key"])

    _progress(node, 1_000_000, 1_000_000, time.time())
    serving = _status(run)
    report("status screen after a sandbox up (b300x1-vllm):\n" + serving)
    assert "health ok, serves the model" in serving and " done " in serving and "100.0%" in serving
    assert "advice:" not in serving and "in CANADA-1" in serving
    data = json.loads(_status(run, "--json"))
    assert data["nodes"][0]["engine"]["state"] == "running" and data["cost_so_far_usd"] is not None
    assert data["uptime_s"] > 0 and data["endpoint"]["serves_model"] is True

    _progress(node, 400_000, 1_000_000, time.time() - 900)  # nothing new for 15 minutes
    stalled = _status(run)
    assert "advice: kimi-sandbox-node0: no download progress for 15 min" in stalled

    _progress(node, 1_000_000, 1_000_000, time.time())
    container = node / "var/lib/fake-node/docker/containers/kimi-engine.json"
    state = json.loads(container.read_text())
    container.write_text(json.dumps({**state, "status": "restarting", "restart_count": 7}))
    looping = _status(run)
    assert "restarting (7 restarts)" in looping
    assert "advice: kimi-sandbox-node0: the engine is restarting in a loop (7 restarts)" in looping

    # The same, through kimi_cluster.cli.status itself, as a user runs it on a real stack's export: the state file and
    # the
    # stack config (its emulator's URL) as options, the nodes over SSH.
    key = (run.workdir / "secrets" / "hyperstack_api_key").read_text().strip()
    repo = Path(__file__).resolve().parents[2]
    stack_file = run.workdir / "Pulumi.sandbox.yaml"
    stack_file.write_text((repo / "Pulumi.sandbox.yaml").read_text().replace(
        "hyperstack:apiUrl: http://127.0.0.1:8700/v1", f"hyperstack:apiUrl: {run.record()['emulator_url']}"))
    with Sandbox(run.workdir, out=io.StringIO()).state_document() as export:
        direct = subprocess.run(
            [sys.executable, "-m", "kimi_cluster.cli.status", "--stack", "sandbox", "--json", "--config",
             str(stack_file),
             "--state", str(export)],
            cwd=repo, capture_output=True, text=True, timeout=120,
            env={**run.environment(), "HYPERSTACK_API_KEY": key})
    assert direct.returncode == 0, direct.stderr
    direct_report = json.loads(direct.stdout)
    assert direct_report["nodes"][0]["vm"]["status"] == "ACTIVE"
    assert direct_report["nodes"][0]["engine"]["restart_count"] == 7 and direct_report["advice"]

    # --watch refreshes until interrupted: by a terminal's Ctrl-C, so SIGINT as a terminal leaves it. A suite started
    # in the background (a shell's `&` ignores SIGINT in what it starts) would hand its children the ignore, and
    # the watch would rightly go on, as a background job does.
    watcher = subprocess.Popen(run.argv("status", "--watch", "1"), cwd=Path(__file__).resolve().parents[2],
                               env=run.environment(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               start_new_session=True, preexec_fn=_sigint_as_a_terminal_leaves_it)
    lines: list[str] = []
    assert watcher.stdout is not None
    for line in watcher.stdout:  # until the second screen has begun
        lines.append(line)
        if sum("kimi-cluster status: stack sandbox" in seen for seen in lines) >= 2:
            break
    watcher.send_signal(signal.SIGINT)
    rest, _ = watcher.communicate(timeout=60)
    watched = "".join(lines) + rest
    assert watched.count("kimi-cluster status: stack sandbox") >= 2 and watcher.returncode == 0, watched

    for text in (json.dumps(mid), serving, stalled, looping, watched, direct.stdout):
        for secret in secrets:
            assert secret not in text
    ok(run("destroy", "--quiet"))
    report(f"status test (b300x1-vllm, hub held mid-download): {time.monotonic() - started:.1f} s")
