"""The hub streams' floor and split tail (kimi_cluster/node/weights_ranges.py): a stream on a slow CDN edge is re-opened
from the byte it reached, the last file is fetched as parallel ranges hashed in order into its one hash, and nothing
is fetched twice. Against the fake hub's CDN edges (kimi_cluster/fakes/hub_edges.py); no test asserts a time."""

from __future__ import annotations

import hashlib
import os
import re
import threading
from pathlib import Path

import pytest

from kimi_cluster.fakes.hub import Edges, FakeHub, Faults
from kimi_cluster.fakes.hub_repo import synthetic_repo
from kimi_cluster.node import fetch_weights
from kimi_cluster.node.weights_files import Cache, Corrupt, Counters, Entry
from kimi_cluster.node.weights_ranges import MAX_REOPENS, REOPENS_PER_DOUBLING, WINDOW_SHARE, Floor, HubStreams
from kimi_cluster.node.weights_transfer import MIN_SPLIT_BYTES, Transfer
from tests.weights.test_fetch_weights import REPO, REVISION, Cluster

pytestmark = pytest.mark.integration  # starts fake nodes and a fake hub

# Scaled to the fake: fast edges at 4 MB/s per connection, slow ones at 1/8 of it; a floor of a quarter second.
FAST = 4e6
FLOOR = {"--hub-min-rate": "1000000", "--hub-floor-share": "0.5", "--hub-window": "0.25"}


class FirstSlow(Edges):
    """The first connection of each file lands on a slow edge, every later one on a fast edge."""

    def draw(self, client: str, path: str, range_header: str) -> float | None:
        with self.lock:
            nth = self.asked[path]
            self.asked[path] += 1
        assert self.fast_rate
        return self.fast_rate * self.slow_factor if nth == 0 else self.fast_rate


@pytest.fixture
def node(tmp_path):
    made: list[Cluster] = []

    def make(hub: FakeHub, **opts: str) -> Cluster:
        c = Cluster(tmp_path, hub, 1, **{**FLOOR, **opts})
        made.append(c)
        return c

    yield make
    for c in made:
        c.kill_all()


def cdn_ranges(hub: FakeHub, sha: str) -> list[int]:
    """The first byte each GET of a blob asked for, in order."""
    starts = []
    for method, path, rng in hub.requests:
        if method == "GET" and path.endswith(sha):
            m = re.match(r"bytes=(\d+)-", rng)
            starts.append(int(m[1]) if m else 0)
    return starts


def test_a_stream_on_a_slow_edge_is_reopened_from_the_byte_it_reached_and_nothing_is_read_twice(node):
    files = synthetic_repo(1, 3_000_000)
    shard = next(f for f in files if f.path.endswith(".safetensors"))
    with FakeHub(REPO, REVISION, files, faults=Faults(edges=FirstSlow(0.0, 1 / 8, FAST))) as hub:
        c = node(hub, **{"--workers": "1"})
        c.start_all()
        assert c.wait() == {0: 0}, c.log(0)
        assert c.complete(0)
        starts = cdn_ranges(hub, shard.sha256)
        reached = int(re.search(r"re-opening from byte ([\d,]+)", c.log(0))[1].replace(",", ""))
        # The slow first connection was left at the byte it had reached, and the next request asked from there: the
        # requests (a block at a time) only move forward, and what came twice is what was in flight when the slow
        # connection was left (one write of the slow edge's, a twentieth of a second).
        assert starts[0] == 0 and reached in starts and starts == sorted(set(starts)), (starts, reached)
        first_sent = next(n for _, m, p, status, n in hub.answers if m == "GET" and p.endswith(shard.sha256))
        assert 0 <= first_sent - reached <= FAST / 8 / 20, (first_sent, reached)
        assert hub.copies(shard.path) < 1.01
        assert "under its floor" in c.log(0) and c.progress(0)["hub_reopens"] == 1
        assert c.record(0)["files"][shard.path]["sha256"] == hashlib.sha256(shard.data).hexdigest()


def test_a_stream_that_only_finds_slow_edges_still_finishes_after_its_bounded_reopens(node):
    files = synthetic_repo(1, 1_500_000)
    with FakeHub(REPO, REVISION, files, faults=Faults(edges=Edges(1.0, 1 / 8, FAST, seed=1))) as hub:
        c = node(hub, **{"--workers": "1"})
        c.start_all()
        assert c.wait(timeout=180) == {0: 0}, c.log(0)
        assert c.complete(0)
        reopens = c.progress(0)["hub_reopens"]
        assert 1 <= reopens <= MAX_REOPENS
        # What was in flight when each connection was left (a write of the slow edge's) is all that came twice.
        shard = next(f for f in files if f.path.endswith(".safetensors"))
        assert hub.copies(shard.path) <= 1 + reopens * (FAST / 8 / 20) / len(shard.data)


def test_the_last_file_is_split_into_parallel_ranges_hashed_in_order_into_its_one_hash(node):
    files = synthetic_repo(1, 6_000_000)
    shard = next(f for f in files if f.path.endswith(".safetensors"))
    with FakeHub(REPO, REVISION, files, faults=Faults(edges=Edges(0.0, 1 / 8, 2e6))) as hub:
        c = node(hub, **{"--workers": "4"})
        c.start_all()
        assert c.wait() == {0: 0}, c.log(0)
        assert c.complete(0)
        starts = cdn_ranges(hub, shard.sha256)
        assert len(set(starts)) >= 2, starts  # more than one range of the one file
        # Each byte asked for once; the hub also sent what was in flight on a connection when its range was cut.
        assert hub.copies(shard.path) < 1.05
        p = c.progress(0)
        assert p["hash_reread_bytes"] > 0 and p["bytes_done"] == p["bytes_total"]
        assert c.record(0)["files"][shard.path]["sha256"] == hashlib.sha256(shard.data).hexdigest()
        assert not list(Path(c.dir(0)).rglob("*.incomplete"))


def test_a_file_stays_in_flight_until_its_last_stream_has_verified_and_committed_it(tmp_path):
    # Forgotten as soon as no range was outstanding, a file still verifying was not done yet either: the scheduler
    # started it again (fetched twice from the hub, seen in bench_weights_edges as 1.011x hub bytes on four nodes).
    files = synthetic_repo(1, 600_000)
    shard = next(f for f in files if f.path.endswith(".safetensors"))
    e = Entry(shard.path, len(shard.data), shard.sha256, None)
    verifying, release = threading.Event(), threading.Event()

    def verified(_: Entry) -> None:
        verifying.set()
        assert release.wait(60)

    with FakeHub(REPO, REVISION, files) as hub:
        args = fetch_weights.parse_args(["--repo", REPO, "--revision", REVISION, "--cache-dir", str(tmp_path / "hub"),
                                         "--record", str(tmp_path / "record.json"), "--progress-file",
                                         str(tmp_path / "progress.json"), "--endpoint", hub.url, "--workers", "1"])
        cache = Cache(args.cache_dir, args.repo, args.revision, args.record)
        streams = HubStreams(args, {}, cache, Counters(), verified)
        try:
            done = streams.submit(*streams.start(e))
            assert verifying.wait(60)
            assert streams.transfers[e.name].outstanding == 0  # every range has ended...
            assert not streams.ended(e.name)  # ...but the file is not settled: still in flight
            release.set()
            done.result(timeout=60)
            assert streams.ended(e.name) and e.name not in streams.transfers
            assert cache.record["files"][e.name]["size"] == len(shard.data)
        finally:
            release.set()
            streams.close(wait=True)


# ---- the in-order hash of a split file, without a hub -----------------------------------------------------------

def transfer(tmp_path: Path, data: bytes) -> Transfer:
    e = Entry("model.safetensors", len(data), hashlib.sha256(data).hexdigest(), None)
    return Transfer(e, str(tmp_path / "blob.incomplete"), Counters())


def test_ranges_written_out_of_order_hash_to_the_whole_files_hash(tmp_path):
    data = os.urandom(12 * MIN_SPLIT_BYTES + 12345)
    t = transfer(tmp_path, data)
    head = t.ranges[0]
    tail = t.split(head, fast=1e6)  # rate unknown: halves
    assert tail is not None and head.end == tail.start
    # The second range is written whole before the first moves: the hash reads it back once the first ends.
    assert t.write(tail, data[tail.start:]) == len(data) - tail.start
    assert t.hashed == 0
    for i in range(0, head.end, 100_000):
        t.write(head, data[i:min(i + 100_000, head.end)])
    assert t.end_range(True) is False and t.end_range(True) is True
    t.verify()
    assert t.reread == len(data) - tail.start
    assert (tmp_path / "blob.incomplete").read_bytes() == data


def test_a_split_cuts_a_slow_range_where_both_streams_end_together(tmp_path):
    data = os.urandom(40 * MIN_SPLIT_BYTES)
    t = transfer(tmp_path, data)
    r = t.ranges[0]
    r.rate = 1e6  # its stream runs at an eighth of the fast streams' rate
    tail = t.split(r, fast=8e6)
    assert tail is not None
    # It keeps a ninth of what it has not yet asked for; the new stream takes the rest.
    assert abs(r.end - len(data) // 9) <= 1 and tail.start == r.end and tail.end == len(data)


def test_a_bad_byte_in_a_split_off_range_fails_the_files_hash(tmp_path):
    data = os.urandom(8 * MIN_SPLIT_BYTES)
    t = transfer(tmp_path, data)
    head = t.ranges[0]
    tail = t.split(head, fast=1e6)
    assert tail is not None
    bad = bytearray(data[tail.start:])
    bad[len(bad) // 2] ^= 1
    t.write(head, data[:head.end])
    t.write(tail, bytes(bad))
    t.end_range(True)
    assert t.end_range(True)
    with pytest.raises(Corrupt, match="hashes to"):
        t.verify()


def test_a_streams_window_is_a_share_of_its_ranges_time_at_its_siblings_rate_never_under_the_least():
    floor = Floor(min_rate=10e6, share=0.3, window_s=3.0)
    shard = 16_300_000_000
    # A whole shard at a fast edge's 68 MB/s: WINDOW_SHARE of its 240 s.
    assert floor.window(shard, 68e6, 0) == pytest.approx(WINDOW_SHARE * shard / 68e6)
    # A split-off 1 GB tail takes 15 s: judged after the least window, not after a whole shard's.
    assert floor.window(10**9, 68e6, 0) == 3.0
    # Siblings slower than the minimum rate do not stretch it past what the minimum gives.
    assert floor.window(shard, 1e6, 0) == floor.window(shard, 10e6, 0) == pytest.approx(WINDOW_SHARE * shard / 10e6)
    # Every REOPENS_PER_DOUBLING re-opens of the same range double it.
    assert floor.window(10**9, 68e6, REOPENS_PER_DOUBLING) == 6.0
    assert floor.window(10**9, 68e6, REOPENS_PER_DOUBLING - 1) == 3.0
