"""The fake SGLang's multi-node group behaves as SGLang 0.5.23's (kimi_cluster/fakes/inference/group.py): the head
serves only once every rank has joined; a lost rank leaves the others running and hung, the head's /health 503
after SGLANG_HEALTH_CHECK_TIMEOUT, its generations stalled until the watchdog ends its engine, a worker's dummy
/health 200; a formed group takes no one new."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from kimi_cluster.fakes.sandbox_services import free_port
from tests.checks.conftest import MODEL

pytestmark = pytest.mark.integration  # starts fake engine processes




def _wait(what: str, predicate: Callable[[], object], timeout: float = 60.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _status(url: str, timeout: float = 30.0, body: bytes | None = None) -> int:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=body, headers={
                "Content-Type": "application/json"}), timeout=timeout) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as err:
        return err.code
    except (urllib.error.URLError, OSError):
        return 0


@dataclass
class Rank:
    proc: subprocess.Popen[bytes]
    log: Path  # its stderr

    def said(self, text: str) -> bool:
        return text in self.log.read_text()

    def alive(self) -> bool:
        return self.proc.poll() is None


class Group:
    """Ranks of one 3-node fake SGLang on loopback; `api` is the head's address."""

    def __init__(self, tmp_path: Path) -> None:
        # Ports below the ephemeral range, for processes that bind them later (kimi_cluster/fakes/sandbox_services.py).
        chosen: list[int] = []
        for _ in range(4):
            chosen.append(free_port(avoid=chosen))
        self.dist, port, *workers = chosen
        self.api = f"http://127.0.0.1:{port}"
        self.port, self.tmp = port, tmp_path
        self.worker_ports = dict(zip((1, 2), workers, strict=True))  # each worker's dummy /health
        self.ranks: list[Rank] = []
        self.env = {**os.environ, "SGLANG_HEALTH_CHECK_TIMEOUT": "1", "FAKE_ENGINE_PEER_LOSS_SECONDS": "1",
                    "FAKE_ENGINE_WATCHDOG_SECONDS": "2"}

    def __call__(self, rank: int) -> Rank:
        log = self.tmp / f"rank{rank}-{len(self.ranks)}.log"
        with log.open("w") as err:
            proc = subprocess.Popen(
                [sys.executable, "-m", "kimi_cluster.fakes.inference_server", "--engine", "sglang", "--model-path",
                 MODEL, "--nnodes", "3", "--node-rank", str(rank), "--dist-init-addr", f"127.0.0.1:{self.dist}",
                 "--port", str(self.port if rank == 0 else self.worker_ports[rank]), "--dist-timeout", "60"],
                env=self.env, stdout=subprocess.DEVNULL, stderr=err)
        self.ranks.append(Rank(proc, log))
        return self.ranks[-1]


@pytest.fixture
def group(tmp_path: Path) -> Iterator[Group]:
    made = Group(tmp_path)
    try:
        yield made
    finally:
        for rank in made.ranks:
            rank.proc.kill()
            rank.proc.wait(timeout=10)


def test_the_head_serves_once_every_rank_joined_and_a_lost_rank_hangs_the_rest(group) -> None:
    api = group.api
    head, first = group(0), group(1)
    # Two of three ranks: the head does not serve yet (SGLang's HTTP server starts after the rendezvous).
    _wait("rank 1 to join", lambda: first.alive() and head.said("rank 1 joined"))
    assert _status(f"{api}/health", timeout=2) == 0
    second = group(2)
    _wait("the head to serve", lambda: _status(f"{api}/health", timeout=2) == 200)

    second.proc.kill()
    # The head finds the rank lost; its /health then waits SGLANG_HEALTH_CHECK_TIMEOUT (1 s here) and says 503.
    _wait("the head's /health to turn 503", lambda: _status(f"{api}/health", timeout=10) == 503)
    assert head.alive()  # an idle hung head is not watched: only a forward trips the watchdog
    # A generation never returns: the collective it needs waits for the lost rank.
    chat = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}).encode()
    assert _status(f"{api}/v1/chat/completions", timeout=2, body=chat) == 0
    # The worker does not exit on its own, and its /health (a dummy, as SGLang's) still says 200.
    assert first.alive()
    assert _status(f"http://127.0.0.1:{group.worker_ports[1]}/health", timeout=5) == 200
    # The stuck forward trips the head's watchdog (2 s here, 300 s by default), 5 s on it ends the head's engine.
    _wait("the head's watchdog", lambda: not head.alive(), 60)
    assert head.said("watchdog timeout") and first.alive()


def test_a_formed_group_takes_no_new_rank(group) -> None:
    head, _ = group(0), group(1)
    late = group(2)
    _wait("the head to serve", lambda: _status(f"{group.api}/health", timeout=2) == 200)
    late.proc.kill()
    _wait("the head's /health to turn 503", lambda: _status(f"{group.api}/health", timeout=10) == 503)
    again = group(2)  # a rank started again cannot rejoin a running group: it hangs too, and the head stays hung
    _wait("the new rank's refusal", lambda: again.said("the head is lost"))
    assert _status(f"{group.api}/health", timeout=10) == 503 and head.alive() and again.alive()
