"""The weights and check steps end to end on a fake node, with the real huggingface_hub and a fake hub.

The systemd-run stub really runs the download unit, so a dropped SSH session, a killed unit, a hub fault and a
re-run behave as they would on a node: the download resumes from the cache, it never starts over.
"""

from __future__ import annotations

import json
import socket
import stat
import time
from collections import Counter
from dataclasses import replace

import pytest

from tests.node.conftest import FAST, REVISION, hub_with, make_settings
from tests.node.test_steps_on_fake_node import failed, ok

pytestmark = pytest.mark.integration  # starts fake nodes, servers or outside tools

TOKEN = "hf_canaryTOKEN9d2c"
SHARD1, SHARD2, SHARD3 = (f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3))


def steps(node, hub, timing=FAST, **extra):
    from kimi_cluster.blueprint import render_node_scripts

    settings = make_settings(nodeRoot=str(node.root), hfEndpoint=hub.url, **extra)
    s = render_node_scripts(settings, 0, "10.0.0.5", "10.0.0.5", timing)
    return s["weights"], s["check"]


def wait_for(predicate, timeout=20.0, what="condition"):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def blobs(node):
    d = node.root / "ephemeral/hf/hub/models--moonshotai--Kimi-K3.1-Pro/blobs"
    return sorted(p.name for p in d.iterdir()) if d.exists() else []


def test_private_repo_downloads_with_the_token_from_stdin_and_checks_complete(node):
    with hub_with(private=True, token=TOKEN) as hub:
        weights, check = steps(node, hub, verifySha256=True)
        assert TOKEN not in weights and TOKEN not in check
        out = ok(node.run(weights, stdin=TOKEN))
        assert "hub token stored" in out and "downloaded" in out
        token_file = node.root / "etc/kimi-cluster/hf_token"
        assert token_file.read_text().strip() == TOKEN
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        result = node.run(check, stdin=TOKEN)
        out2 = ok(result)
        assert "RESULT: COMPLETE" in out2 and "safetensors      : 3/3" in out2 and "sha256           : checked" in out2
        for text in (out, out2, result.stderr, (node.root / "var/log/kimi-cluster/weights.log").read_text(),
                     str(node.calls())):
            assert TOKEN not in text
        run_calls = node.calls("systemd-run")
        assert len(run_calls) == 1 and any(a.startswith("--setenv=HF_ENDPOINT=http://127.0.0.1") for a in run_calls[0])

        # Twice in a row: the second run finds everything in the cache and fetches nothing.
        ok(node.run(weights, stdin=TOKEN))
        assert all(hub.copies(f) == 1 for f in hub.files)


def test_private_repo_without_a_token_fails_with_the_hub_reason(node):
    with hub_with(private=True, token=TOKEN) as hub:
        weights, _ = steps(node, hub)
        out = failed(node.run(weights, stdin=""), "no hub token given", "the weights download failed",
                     "RepositoryNotFoundError")
        assert "401" in out


def test_a_missing_repo_fails_the_download_with_the_reason(node):
    with hub_with(missing_repo=True) as hub:
        weights, check = steps(node, hub)
        failed(node.run(weights), "the weights download failed", "Repository Not Found")
        failed(node.run(check), "cannot read the hub's manifest")


def test_a_file_served_short_is_resumed_in_the_same_run_and_verified(node):
    with hub_with(short=Counter({SHARD2: 1})) as hub:
        weights, check = steps(node, hub, downloadWorkers=1)
        out = ok(node.run(weights))
        assert "RESULT: COMPLETE" in ok(node.run(check))
        assert hub.downloads(SHARD1) == 1
        assert hub.downloads(SHARD2) == 2  # the short answer, then a Range request for the rest
        assert "resuming" in (node.root / "var/log/kimi-cluster/weights.log").read_text() and "5/5" in out


def test_a_dropped_connection_mid_file_resumes_inside_the_same_run(node):
    with hub_with(drop=Counter({SHARD3: 1})) as hub:
        weights, check = steps(node, hub)
        ok(node.run(weights))
        assert "RESULT: COMPLETE" in ok(node.run(check))


def test_a_killed_unit_fails_the_step_and_the_rerun_resumes_from_the_cache(node):
    # ~0.4 s per shard, one file at a time: the kill lands after the first shard and before the last.
    with hub_with(bytes_per_second=40_000) as hub:
        weights, check = steps(node, hub, downloadWorkers=1)
        proc = node.start(weights)

        def finished() -> list[str]:
            return [b for b in blobs(node) if not b.endswith(".incomplete")]

        wait_for(lambda: len(finished()) >= 2 and node.unit("kimi-weights") is not None, what="the first shard")
        node.shell("systemctl stop kimi-weights")
        out, _ = proc.communicate(timeout=30)
        assert proc.returncode != 0
        assert "stopped before finishing" in out and "run 'pulumi up' again to resume" in out
        done_before = set(finished())
        assert len(done_before) < len(hub.files), "the kill came too late to interrupt anything"

        hub.faults.bytes_per_second = None
        ok(node.run(weights))
        assert "RESULT: COMPLETE" in ok(node.run(check))
        assert not [b for b in blobs(node) if b.endswith(".incomplete")]
        assert hub.downloads("config.json") == 1
        assert hub.downloads(SHARD1) == 1, "a shard finished before the kill was downloaded again"
        assert done_before <= set(blobs(node))


def test_a_dropped_ssh_session_leaves_the_download_running_and_the_rerun_follows_it(node):
    with hub_with(bytes_per_second=40_000) as hub:
        weights, check = steps(node, hub, downloadWorkers=1)
        first = node.start(weights, stdin=TOKEN)
        wait_for(lambda: (node.unit("kimi-weights") or {}).get("state") == "active", what="the unit")
        node.cleanup_process(first)  # the SSH session drops: the script dies, the unit does not

        assert (node.unit("kimi-weights") or {}).get("state") == "active"
        out = ok(node.run(weights, stdin=TOKEN))
        assert "already running as unit kimi-weights; following it" in out
        assert len(node.calls("systemd-run")) == 1
        assert "RESULT: COMPLETE" in ok(node.run(check, stdin=TOKEN))
        assert all(hub.copies(f) == 1 for f in hub.files)


def test_the_download_deadline_gives_up_but_leaves_the_unit_running(node):
    with hub_with(bytes_per_second=5_000) as hub:
        weights, _ = steps(node, hub, timing=replace(FAST, download_timeout_s=1), downloadWorkers=1)
        failed(node.run(weights), "gave up after 1 s waiting for the weights download",
               "the next 'pulumi up' follows it")
        assert (node.unit("kimi-weights") or {}).get("state") == "active"


@pytest.mark.parametrize("topology", ["b300x1-vllm"])
def test_the_weights_step_is_the_same_for_vllm(node, topology):
    with hub_with() as hub:
        from kimi_cluster.blueprint import render_node_scripts

        settings = make_settings(topology, nodeRoot=str(node.root), hfEndpoint=hub.url)
        s = render_node_scripts(settings, 0, "10.0.0.5", "10.0.0.5", FAST)
        ok(node.run(s["weights"]))
        assert "RESULT: COMPLETE" in ok(node.run(s["check"]))
        snap = node.root / f"ephemeral/hf/hub/models--moonshotai--Kimi-K3.1-Pro/snapshots/{REVISION}"
        assert (snap / "config.json").exists()


PEER_TOKEN = "peerCANARY-token-8e21"


def test_four_fake_nodes_share_the_download_and_check_against_the_recorded_hashes(node_factory):
    from kimi_cluster.blueprint import render_node_scripts
    from kimi_cluster.fakes.sandbox_services import free_port

    ips = [f"127.0.0.{2 + r}" for r in range(4)]
    nodes = [node_factory(private_ip=ip) for ip in ips]
    port = free_port(*ips)
    with hub_with(private=True, token=TOKEN) as hub:
        scripts = []
        for rank, n in enumerate(nodes):
            settings = make_settings(nodeRoot=str(n.root), hfEndpoint=hub.url, peerPort=str(port))
            scripts.append(render_node_scripts(settings, rank, ips[rank], ips[0], FAST, peer_ips=ips))
        procs = [n.start(s["weights"], stdin=f"{TOKEN}\n{PEER_TOKEN}\n") for n, s in zip(nodes, scripts, strict=True)]
        outs = [p.communicate(timeout=120)[0] for p in procs]
        assert [p.returncode for p in procs] == [0, 0, 0, 0], outs
        assert all(hub.copies(f) == 1 for f in hub.files), "a file came from the hub more than once"
        for n, s, out in zip(nodes, scripts, outs, strict=True):
            token_file = n.root / "etc/kimi-cluster/peer_token"
            assert token_file.read_text().strip() == PEER_TOKEN and stat.S_IMODE(token_file.stat().st_mode) == 0o600
            check = ok(n.run(s["check"], stdin=TOKEN))
            assert "RESULT: COMPLETE" in check
            assert f"{len(hub.files)} from the hashes recorded while downloading, 0 read now" in check
            log = (n.root / "var/log/kimi-cluster/weights.log").read_text()
            for text in (out, check, log, s["weights"], s["check"], str(n.calls())):
                assert PEER_TOKEN not in text and TOKEN not in text
            progress = json.loads((n.root / "ephemeral/kimi/progress/weights.json").read_text())
            assert progress["files_done"] == progress["files_total"] == len(hub.files)
        with socket.socket() as probe:
            assert probe.connect_ex((ips[0], port)) != 0, "the peer server is still listening"

        # A re-run of every node, as one `up` makes it (a changed connection, a VM of the group re-created): each
        # complete node serves its files until every peer says it has them too, and takes nothing from the hub or
        # the peers; none waits out its peer timeout.
        before = len(hub.answers)
        started = time.monotonic()
        procs = [n.start(s["weights"], stdin=f"{TOKEN}\n{PEER_TOKEN}\n") for n, s in zip(nodes, scripts, strict=True)]
        outs = [p.communicate(timeout=120)[0] for p in procs]
        assert [p.returncode for p in procs] == [0, 0, 0, 0], outs
        # A node waiting for a peer's first answer until its peer timeout would take FAST's 300 s.
        assert time.monotonic() - started < 60 < FAST.peer_timeout_s
        for n in nodes:
            log = (n.root / "var/log/kimi-cluster/weights.log").read_text()
            assert "were verified on an earlier run; serving them until every peer has them" in log
        assert len(hub.answers) == before


def test_the_check_reads_a_file_again_when_it_changed_after_the_download(node):
    with hub_with() as hub:
        weights, check = steps(node, hub)
        ok(node.run(weights))
        snap = node.root / f"ephemeral/hf/hub/models--moonshotai--Kimi-K3.1-Pro/snapshots/{REVISION}"
        blob = (snap / SHARD2).resolve()
        data = bytearray(blob.read_bytes())
        data[100] ^= 0x01
        blob.write_bytes(bytes(data))  # same size, new mtime: the record no longer vouches for it
        out = failed(node.run(check), "CORRUPT    " + SHARD2)
        assert "4 from the hashes recorded while downloading, 1 read now" in out
