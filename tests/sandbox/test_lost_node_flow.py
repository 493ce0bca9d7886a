"""A lost node of the default cluster (h100x4-sglang, one model on four nodes, one process group) comes back under the
real CLI: `up`, a worker's VM deleted behind the stack's back (`sandbox reclaim`), `up`; then the same for the head.

Each time the surviving ranks hang (the fake engine does as SGLang 0.5.23 does: its head's /health turns 503, no rank
exits), `up` re-creates the VM, the new node takes every file from its peers (the hub sends no file byte), every rank
relaunches head first and the group forms again, and `verify` passes through the endpoint: the same URL when a worker
was lost, the new head's when the head was. Each `up`'s time is printed against the first bring-up's.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from .conftest import engine_log, hub_stats, leftover_processes, ok, report, wait_for

pytestmark = [pytest.mark.flow, pytest.mark.timeout(1800)]

# An up that re-creates a node runs its whole chain and every rank's launch again: minutes on 2 loaded cores.
REPLACING_UP_S = 900
# What the hub may send beyond the first bring-up: no file byte (its manifest answers are not file bytes).
HUB_SLACK_BYTES = 4096
HEALTH_TIMEOUT_S = 2  # the fake head's SGLANG_HEALTH_CHECK_TIMEOUT here (20 s on a real head)


def _engine_pids(workdir: Path, ips: list[str]) -> list[int]:
    return [int((workdir / "nodes" / ip / "var/lib/fake-node/engines/kimi-engine.pid").read_text()) for ip in ips]


def _progress(workdir: Path, ip: str) -> dict:
    return dict(json.loads((workdir / "nodes" / ip / "ephemeral/kimi/progress/weights.json").read_text()))


def _head_health(run, head_ip: str) -> int:
    """The head engine's /health, asked on its own loopback (where the engine listens, behind the proxy)."""
    port = run.record()["engine_port"]
    probe = ("import urllib.request, urllib.error\ntry:\n"
             f"    print(urllib.request.urlopen('http://127.0.0.1:{port}/health', timeout=30).status)\n"
             "except urllib.error.HTTPError as e:\n    print(e.code)\n")
    done = run.in_node(head_ip, "python3", "-c", probe, timeout=60)
    return int(done.stdout.strip() or 0)


def _lose_and_come_back(run, rank: int, first_s: float, hub_before: int) -> tuple[float, dict]:
    """Reclaim node `rank`, see the group hang, `up`, and check the group formed again from the peers' files."""
    before = run.outputs()
    ips = list(before["node_private_ips"])
    lost_name = before["node_names"][rank]
    survivors = [ip for r, ip in enumerate(ips) if r != rank]
    pids = dict(zip(ips, _engine_pids(run.workdir, ips), strict=True))
    ok(run("reclaim", lost_name))
    if rank != 0:
        # The head finds its rank gone and hangs: its /health answers 503 after the health check's timeout.
        wait_for("the head's engine to hang", lambda: f"rank {rank} is lost" in engine_log(run.workdir), 60)
        assert _head_health(run, ips[0]) == 503
    else:
        wait_for("the workers to hang", lambda: engine_log(run.workdir).count("the head is lost") >= 3, 60)
    # No surviving rank exits by itself.
    assert all(Path(f"/proc/{pids[ip]}").exists() for ip in survivors)

    up = run("up", timeout=REPLACING_UP_S)
    out = ok(up)
    after = run.outputs()
    new_ip = after["node_private_ips"][rank]
    assert new_ip != ips[rank] and after["node_private_ips"][:rank] + after["node_private_ips"][rank + 1:] == survivors
    # Every file from the peers, none from the hub.
    fetched = _progress(run.workdir, new_ip)
    assert fetched["hub_bytes"] == 0 and fetched["peer_bytes"] == fetched["bytes_total"] > 0, fetched
    sent = hub_stats(run.workdir)["body_bytes"]
    assert sent - hub_before <= HUB_SLACK_BYTES, (sent, hub_before)
    for r, ip in enumerate(after["node_private_ips"]):
        if ip != new_ip:
            log = (run.workdir / "nodes" / ip / "var/log/kimi-cluster/weights.log").read_text()
            assert "serving them until every peer has them" in log, r
            launched = run.step_output(f"kimi-node{r}-launch")
            assert f"starting sglang rank {r} of 4" in launched, r
            # A new head changes every rank's configuration (its rendezvous address); a new worker only the group.
            assert rank == 0 or "a VM of this engine group is new" in launched, r
    # Every rank runs a new engine, and the old ones are gone.
    now = _engine_pids(run.workdir, list(after["node_private_ips"]))
    assert all(Path(f"/proc/{pid}").exists() for pid in now)
    assert not any(Path(f"/proc/{pids[ip]}").exists() for ip in survivors)
    assert "kimi-ready-wait" in out
    assert _head_health(run, after["node_private_ips"][0]) == 200
    ok(run("verify"))
    report(f"h100x4-sglang, node {rank} lost: up {up.seconds:.1f} s against the first bring-up's {first_s:.1f} s "
           f"({up.seconds / first_s:.2f}x); hub file bytes +{sent - hub_before}; the new node took "
           f"{fetched['peer_bytes']:,} bytes from its peers")
    return up.seconds, after


def test_a_lost_worker_then_a_lost_head_come_back_from_their_peers(sandbox) -> None:
    run = sandbox(env={"FAKE_ENGINE_HEALTH_CHECK_TIMEOUT": str(HEALTH_TIMEOUT_S)})
    first = run("up", "--topology", "h100x4-sglang")
    ok(first)
    outputs = run.outputs()
    hub = hub_stats(run.workdir)["body_bytes"]
    assert hub == _progress(run.workdir, outputs["node_private_ips"][0])["bytes_total"]  # each file once

    _, after_worker = _lose_and_come_back(run, 3, first.seconds, hub)
    # A worker lost: the endpoint, its certificate and the client configs are unchanged.
    assert after_worker["endpoint_url"] == outputs["endpoint_url"]
    assert after_worker["client_configs"] == outputs["client_configs"]

    _, after_head = _lose_and_come_back(run, 0, first.seconds, hub)
    # The head lost: the endpoint follows the new head's address, and so do the client configs; the CA stays.
    new_host = after_head["head_public_ip"]
    assert new_host != outputs["head_public_ip"]
    assert after_head["endpoint_url"] == re.sub(r"//[^:/]+", f"//{new_host}", outputs["endpoint_url"])
    assert after_head["ca_certificate"] == outputs["ca_certificate"]
    assert outputs["head_public_ip"] not in json.dumps(after_head["client_configs"])
    assert new_host in json.dumps(after_head["client_configs"])

    ok(run("destroy", "--quiet"))
    assert leftover_processes(run.workdir) == []
