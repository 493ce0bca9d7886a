"""The fake hub's hold (kimi_cluster/fakes/hub_hold.py): a held hub stops every file body at its middle until the test
releases it, so a test waits on "a download is under way" instead of guessing how slow a hub must be."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request

import pytest

from kimi_cluster.fakes.hub import HOLD_PATH, RELEASE_PATH, STATS_PATH, FakeHub
from kimi_cluster.fakes.hub_hold import pieces
from kimi_cluster.fakes.hub_repo import tiny_repo

pytestmark = pytest.mark.integration  # starts a fake hub

REPO = "moonshotai/Kimi-K3.1-Pro"
REVISION = "6d0a0202956796543364d666ab19c6ad1a494ee1"


def _post(hub: FakeHub, path: str) -> dict:
    request = urllib.request.Request(hub.url + path, data=b"", method="POST")
    with urllib.request.urlopen(request, timeout=10) as answer:
        return dict(json.loads(answer.read()))


def _stats(hub: FakeHub) -> dict:
    with urllib.request.urlopen(hub.url + STATS_PATH, timeout=10) as answer:
        return dict(json.loads(answer.read()))


def _wait_for(what: str, predicate, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"gave up after {timeout:g} s waiting for {what}"
        time.sleep(0.05)


def test_every_write_is_cut_at_the_middle_and_covers_the_body_once() -> None:
    for limit, step in ((10, 4), (9, 3), (1, 4), (0, 4), (1 << 20, 64 * 1024), (5, 100)):
        cut = pieces(limit, step)
        # Consecutive, each at most `step`, covering the body once.
        assert [a for a, _ in cut] == [0, *(b for _, b in cut)][:len(cut)] and (cut[-1][1] if cut else 0) == limit
        assert all(0 < b - a <= step for a, b in cut)
        assert limit < 2 or limit // 2 in [a for a, _ in cut]


def test_a_held_body_stops_at_its_middle_until_released_then_arrives_whole() -> None:
    files = tiny_repo(1)
    shard = next(f for f in files if f.path.endswith(".safetensors"))
    with FakeHub(REPO, REVISION, files) as hub:
        assert _post(hub, HOLD_PATH) == {"holding": True}
        got: dict[str, bytes] = {}
        first_half = threading.Event()

        def download() -> None:
            url = f"{hub.url}/{REPO}/resolve/{REVISION}/{shard.path}"
            with urllib.request.urlopen(url, timeout=60) as answer:
                got["first"] = answer.read(len(shard.data) // 2)
                first_half.set()
                got["rest"] = answer.read()

        reader = threading.Thread(target=download)
        reader.start()
        _wait_for("the body held at its middle", lambda: _stats(hub)["held"] == 1)
        assert first_half.wait(30) and got["first"] == shard.data[: len(shard.data) // 2]
        assert "rest" not in got and _stats(hub)["holding"] is True
        assert _post(hub, RELEASE_PATH) == {"holding": False}
        reader.join(60)
        assert got["first"] + got["rest"] == shard.data
        assert _stats(hub)["held"] == 0
        # Released, a body flows through its middle; anything but the two controls is no route for a POST.
        with urllib.request.urlopen(f"{hub.url}/{REPO}/resolve/{REVISION}/{shard.path}", timeout=30) as answer:
            assert answer.read() == shard.data
        with pytest.raises(urllib.error.HTTPError) as refused:
            _post(hub, "/_fake/pause")
        assert refused.value.code == 404


def test_a_hold_of_the_shards_lets_the_small_files_through() -> None:
    """`--hold '*.safetensors'`: config.json arrives whole at once (what a kernel warm-up reads of a model) while a
    shard's body waits at its middle."""
    files = tiny_repo(1)
    shard = next(f for f in files if f.path.endswith(".safetensors"))
    config = next(f for f in files if f.path == "config.json")
    with FakeHub(REPO, REVISION, files) as hub:
        hub.hold.hold("*.safetensors")
        with urllib.request.urlopen(f"{hub.url}/{REPO}/resolve/{REVISION}/config.json", timeout=30) as answer:
            assert answer.read() == config.data
        with urllib.request.urlopen(f"{hub.url}/{REPO}/resolve/{REVISION}/{shard.path}", timeout=60) as answer:
            assert answer.read(len(shard.data) // 2) == shard.data[: len(shard.data) // 2]
            _wait_for("the shard held at its middle", lambda: _stats(hub)["held"] == 1)
            # POST HOLD_PATH holds every file again; the release lets the shard finish.
            assert _post(hub, HOLD_PATH) == {"holding": True} and hub.hold.only == "*"
            assert _post(hub, RELEASE_PATH) == {"holding": False}
            assert answer.read() == shard.data[len(shard.data) // 2:]
