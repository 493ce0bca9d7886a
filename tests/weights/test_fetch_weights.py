"""kimi_cluster/node/fetch_weights.py on several loopback "nodes" (127.0.0.2, .3, ...) against the fake hub.

Each node is the real program in its own process with its own cache, exactly as the weights unit runs it; the hub
sees each node as its own client address. No test here asserts a time.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import httpx2
import pytest

from kimi_cluster.fakes.hub import FakeHub, Faults
from kimi_cluster.fakes.hub_repo import synthetic_repo, tiny_repo
from kimi_cluster.fakes.sandbox_services import free_port
from kimi_cluster.node.fetch_weights import peer_authorization
from kimi_cluster.node.weights import assign

pytestmark = pytest.mark.integration  # starts fake nodes, servers or outside tools

PROJECT = Path(__file__).resolve().parents[2]
REPO = "moonshotai/Kimi-K3.1-Pro"
REVISION = "6d0a0202956796543364d666ab19c6ad1a494ee1"
TOKEN = "peerTOKENcanary-5b1e9f"


class Cluster:
    def __init__(self, tmp: Path, hub: FakeHub, nodes: int, **opts: str) -> None:
        self.tmp, self.hub, self.n = tmp, hub, nodes
        self.hosts = [f"127.0.0.{2 + r}" for r in range(nodes)]
        self.port = free_port(*self.hosts)
        (tmp / "peer_token").write_text(TOKEN + "\n")
        os.chmod(tmp / "peer_token", 0o600)
        # Long enough for every node to start on a busy machine (a peer not up yet would count as dead).
        self.opts = {"--peer-timeout": "10", "--stall-seconds": "20", "--poll-seconds": "0.2", "--workers": "4", **opts}
        self.procs: dict[int, subprocess.Popen] = {}

    def dir(self, r: int) -> Path:
        return self.tmp / f"node{r}"

    def argv(self, r: int) -> list[str]:
        d = self.dir(r)
        peers = ",".join(f"{h}:{self.port}" for h in self.hosts) if self.n > 1 else ""
        argv = [sys.executable, "-m", "kimi_cluster.node.fetch_weights", "--repo", REPO, "--revision", REVISION,
                "--cache-dir", str(d / "hf/hub"), "--record", str(d / f"kimi/verified/{REVISION}.json"),
                "--progress-file", str(d / "kimi/progress/weights.json"), "--result-file", str(d / "result"),
                "--endpoint", self.hub.url, "--rank", str(r), "--peers", peers,
                "--peer-token-file", str(self.tmp / "peer_token"), "--report-seconds", "0.5",
                "--source-address", self.hosts[r]]
        for k, v in self.opts.items():
            argv += [k, v]
        return argv

    def start(self, r: int) -> subprocess.Popen:
        self.dir(r).mkdir(parents=True, exist_ok=True)
        log = open(self.dir(r) / "log.txt", "a")
        p = subprocess.Popen(self.argv(r), cwd=PROJECT, env={**os.environ, "PYTHONPATH": str(PROJECT)},
                             stdout=log, stderr=subprocess.STDOUT)
        log.close()
        self.procs[r] = p
        return p

    def start_all(self) -> None:
        for r in range(self.n):
            self.start(r)

    def wait(self, ranks=None, timeout: float = 120) -> dict[int, int]:
        ranks = list(self.procs) if ranks is None else ranks
        return {r: self.procs[r].wait(timeout=timeout) for r in ranks}

    def log(self, r: int) -> str:
        return (self.dir(r) / "log.txt").read_text()

    def progress(self, r: int) -> dict:
        return json.loads((self.dir(r) / "kimi/progress/weights.json").read_text())

    def snapshot(self, r: int) -> Path:
        return self.dir(r) / f"hf/hub/models--moonshotai--Kimi-K3.1-Pro/snapshots/{REVISION}"

    def complete(self, r: int) -> bool:
        return all((self.snapshot(r) / f.path).is_file() and (self.snapshot(r) / f.path).read_bytes() == f.data
                   for f in self.hub.files.values())

    def record(self, r: int) -> dict:
        return json.loads((self.dir(r) / f"kimi/verified/{REVISION}.json").read_text())

    def kill_all(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()


@pytest.fixture
def cluster(tmp_path):
    made: list[Cluster] = []

    def make(hub: FakeHub, nodes: int, **opts: str) -> Cluster:
        c = Cluster(tmp_path, hub, nodes, **opts)
        made.append(c)
        return c

    yield make
    for c in made:
        c.kill_all()


def listening(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex((host, port)) == 0


def hub_bytes(hub: FakeHub, client: str) -> int:
    return hub.sent[client]


def test_three_nodes_take_each_file_from_the_hub_once_and_end_complete(cluster):
    files = synthetic_repo(12, 20_000)
    with FakeHub(REPO, REVISION, files) as hub:
        c = cluster(hub, 3)
        c.start_all()
        assert c.wait() == {0: 0, 1: 0, 2: 0}
        for r in range(3):
            assert c.complete(r), c.log(r)
            p = c.progress(r)
            assert p["files_done"] == p["files_total"] == len(files) and p["bytes_done"] == p["bytes_total"]
            assert p["hub_bytes"] + p["peer_bytes"] == p["bytes_total"] and p["peer_bytes"] > 0
            assert isinstance(p["updated_at"], float) and set(p) == {
                "bytes_done", "bytes_total", "files_done", "files_total", "updated_at", "hub_bytes", "peer_bytes",
                "revision", "metadata_done", "hub_reopens", "hash_reread_bytes"}
            assert p["metadata_done"] is True and p["revision"] == REVISION
        assert all(hub.copies(f) == 1 for f in hub.files), "a file came from the hub more than once"
        checkpoint = sum(len(f.data) for f in files)
        shares = [hub_bytes(hub, h) for h in c.hosts]
        assert sum(shares) == checkpoint and max(shares) < checkpoint / 2
        # Nothing is left listening, and the token is in no log line and no URL.
        assert not any(listening(h, c.port) for h in c.hosts)
        for r in range(3):
            assert TOKEN not in c.log(r) and TOKEN not in " ".join(c.argv(r))
        assert not any(TOKEN in path for _, _, path, _, _ in hub.answers)


def test_the_peer_server_refuses_a_wrong_token_and_unfinished_files(cluster):
    files = synthetic_repo(6, 50_000)

    with FakeHub(REPO, REVISION, files, faults=Faults(client_bytes_per_second=60_000)) as hub:
        c = cluster(hub, 2, **{"--peer-timeout": "30"})
        c.start(0)  # its peer never comes: it keeps serving while it waits
        dest = f"{c.hosts[0]}:{c.port}"
        url = f"http://{dest}"
        deadline = time.time() + 30
        while not listening(c.hosts[0], c.port):
            assert time.time() < deadline, c.log(0)
            time.sleep(0.1)
        assert httpx2.get(f"{url}/status").status_code == 401
        assert httpx2.get(f"{url}/status", headers={"Authorization": "Bearer wrong"}).status_code == 401
        # The token signs each request (kimi_cluster/node/fetch_weights.py peer_authorization); sent as itself it opens
        # nothing.
        assert httpx2.get(f"{url}/status", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 401
        ok = httpx2.get(f"{url}/status", headers={"Authorization": peer_authorization(TOKEN, "GET", dest, "/status")})
        assert ok.status_code == 200 and ok.json()["complete"] is False
        not_yet = [f for f in hub.files if f not in ok.json()["done"]][0]
        r = httpx2.get(f"{url}/files/{not_yet}",
                       headers={"Authorization": peer_authorization(TOKEN, "GET", dest, f"/files/{not_yet}")})
        assert r.status_code == 404
        c.kill_all()


def test_a_peer_killed_mid_transfer_loses_its_files_to_the_hub_and_every_node_ends_complete(cluster):
    files = synthetic_repo(16, 40_000)
    checkpoint = sum(len(f.data) for f in files)
    with FakeHub(REPO, REVISION, files, faults=Faults(client_bytes_per_second=200_000)) as hub:
        c = cluster(hub, 3, **{"--peer-timeout": "6"})
        c.start_all()
        victim = c.hosts[2]
        deadline = time.time() + 60
        while hub_bytes(hub, victim) < checkpoint / 3 / 2:  # half of its share
            assert time.time() < deadline and c.procs[2].poll() is None, c.log(2)
            time.sleep(0.02)
        c.procs[2].send_signal(signal.SIGKILL)
        c.procs[2].wait()
        kept = set(c.record(2)["files"])
        assert c.wait([0, 1]) == {0: 0, 1: 0}, c.log(0) + c.log(1)
        assert c.complete(0) and c.complete(1)
        assert "peer 2" in c.log(0) and "take them from the hub" in c.log(0)
        survivors = hub_bytes(hub, c.hosts[0]) + hub_bytes(hub, c.hosts[1])
        assert survivors + hub_bytes(hub, victim) <= 1.5 * checkpoint
        assert not any(listening(h, c.port) for h in c.hosts)

        # Its next run keeps what it verified and fetches only the rest (from the hub: the peers have left).
        before = hub_bytes(hub, victim)
        c.start(2)
        assert c.wait([2]) == {2: 0}, c.log(2)
        assert c.complete(2)
        kept_bytes = sum(len(hub.files[name].data) for name in kept)
        assert hub_bytes(hub, victim) - before == checkpoint - kept_bytes
        assert f"kept {len(kept)} of {len(files)} files" in c.log(2)


def test_a_corrupted_byte_from_a_peer_is_caught_in_stream_and_fetched_again_from_the_hub(cluster):
    files = synthetic_repo(6, 30_000)
    with FakeHub(REPO, REVISION, files) as hub:
        c = cluster(hub, 2)
        c.start_all()
        assert c.wait() == {0: 0, 1: 0}
        split = assign([(f.path, len(f.data)) for f in files], 2)
        mine = sorted(n for n, r in split.items() if r == 0 and n.endswith(".safetensors"))
        bad, gone = mine[0], mine[1]
        # Node 0's disk flips a byte in one of its files after it verified it (same size, same mtime: it still
        # trusts it) and loses another, so it serves again; node 1 has lost the flipped one.
        blob = (c.snapshot(0) / bad).resolve()
        st = blob.stat()
        data = bytearray(blob.read_bytes())
        data[len(data) // 2] ^= 0x01
        blob.write_bytes(bytes(data))
        os.utime(blob, ns=(st.st_atime_ns, st.st_mtime_ns))
        (c.snapshot(0) / gone).resolve().unlink()
        (c.snapshot(0) / gone).unlink()
        (c.snapshot(1) / bad).resolve().unlink()
        (c.snapshot(1) / bad).unlink()
        downloads_before = hub.downloads(bad)

        c.start_all()
        assert c.wait() == {0: 0, 1: 0}, c.log(0) + c.log(1)
        assert "CORRUPT from peer 0" in c.log(1) and bad in c.log(1)
        assert (c.snapshot(1) / bad).read_bytes() == hub.files[bad].data
        assert hub.downloads(bad) == downloads_before + 1


@pytest.mark.parametrize("times", [1, 2])
def test_a_bad_byte_from_the_hub_is_fetched_again_once_then_fails_naming_the_file(cluster, times):
    target = "model-00002-of-00003.safetensors"
    with FakeHub(REPO, REVISION, tiny_repo(), faults=Faults(corrupt=Counter({target: times}))) as hub:
        c = cluster(hub, 1)
        c.start(0)
        code = c.wait()[0]
        assert hub.downloads(target) == 2
        blob_dir = c.dir(0) / "hf/hub/models--moonshotai--Kimi-K3.1-Pro/blobs"
        if times == 1:
            assert code == 0 and c.complete(0) and "CORRUPT from the hub" in c.log(0)
        else:
            assert code == 1
            result = (c.dir(0) / "result").read_text()
            assert result.startswith(f"failed {REVISION}") and target in result and "failed its hash twice" in result
            assert not (blob_dir / hub.files[target].sha256).exists()
            # (other files' streams may be cut off mid-way and left .incomplete: the next run deletes those)
            assert not (blob_dir / (hub.files[target].sha256 + ".incomplete")).exists()


def test_a_resumed_run_transfers_no_finished_file_again(cluster):
    files = synthetic_repo(12, 40_000)
    checkpoint = sum(len(f.data) for f in files)
    with FakeHub(REPO, REVISION, files, faults=Faults(client_bytes_per_second=150_000)) as hub:
        c = cluster(hub, 2)
        c.start_all()
        deadline = time.time() + 60
        while sum(hub.sent[h] for h in c.hosts) < checkpoint / 2:
            assert time.time() < deadline
            time.sleep(0.02)
        c.kill_all()  # both nodes at once: an interrupted `pulumi up`, or both units killed
        kept = [set(c.record(r)["files"]) if (c.dir(r) / f"kimi/verified/{REVISION}.json").exists() else set()
                for r in range(2)]
        assert any(kept) and not all(len(k) == len(files) for k in kept)
        hub.faults.client_bytes_per_second = None
        c.start_all()
        assert c.wait() == {0: 0, 1: 0}
        for r in range(2):
            assert c.complete(r)
            p = c.progress(r)
            kept_bytes = sum(len(hub.files[n].data) for n in kept[r])
            assert p["hub_bytes"] + p["peer_bytes"] == checkpoint - kept_bytes, "a finished file came again"

        # And once complete, a third run fetches nothing at all, not even the manifest.
        answers = len(hub.answers)
        c.start_all()
        assert c.wait() == {0: 0, 1: 0}
        assert len(hub.answers) == answers
        assert "nothing to fetch" in c.log(0)


def test_a_complete_node_with_serve_complete_feeds_a_new_twin_with_no_hub_bytes(cluster, tmp_path):
    """--serve-complete (replicas): node 0 already has every file; node 1 is new. Node 0 serves without asking the
    hub anything, node 1 takes every file from it, and node 0 stops once node 1 is complete."""
    files = synthetic_repo(6, 20_000)
    with FakeHub(REPO, REVISION, files) as hub:
        alone = cluster(hub, 1)
        alone.start(0)
        assert alone.wait() == {0: 0}
        # The same node 0 directory, now in a fan-out of two with serve-complete.
        c = cluster(hub, 2)
        argv = c.argv
        c.argv = lambda r: argv(r) + ["--serve-complete"]  # the same argv, with the flag
        c.start(0)
        c.start(1)
        assert c.wait() == {0: 0, 1: 0}, (c.log(0), c.log(1))
        assert c.complete(1)
        # Node 0 fetched everything once, alone; node 1 took no file byte from the hub (it reads the manifest there,
        # a few KB of API, not from its fan-out address).
        first = hub.sent[c.hosts[0]]
        assert first == sum(len(f.data) for f in files) and hub.sent[c.hosts[1]] == 0, hub.sent
        assert c.progress(1)["peer_bytes"] == c.progress(1)["bytes_total"] and c.progress(1)["hub_bytes"] == 0
        assert "serving them until every peer has them" in c.log(0)
        assert not any(listening(h, c.port) for h in c.hosts)


def test_a_lone_node_takes_the_metadata_before_any_shard_for_the_kernel_warm_up(cluster):
    # The kernel warm-up (kimi_cluster/plan/templates/warmup.sh.j2) waits for config.json and the rest of the small
    # files only.
    files = synthetic_repo(6, 20_000)
    with FakeHub(REPO, REVISION, files) as hub:
        c = cluster(hub, 1, **{"--workers": "1"})
        c.start_all()
        assert c.wait() == {0: 0}
        served = [p for _, m, p, status, _ in hub.answers if m == "GET" and status in (200, 206)]
        bodies = [f.path for p in served for f in files if p.endswith("/" + f.path) or p.endswith(f.sha256)]
        metadata = [f.path for f in files if not f.path.endswith(".safetensors")]
        assert sorted(bodies[:len(metadata)]) == sorted(metadata), bodies
        assert c.progress(0)["metadata_done"] is True
