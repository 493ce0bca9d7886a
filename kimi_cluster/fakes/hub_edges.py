"""The fake hub's pacing (kimi_cluster/fakes/hub.py): a cap per client address (ClientPace), and CDN edges: every
connection lands on an edge that caps it, fast or slow, drawn from a seed at the connection's first body answer; a
keep-alive connection stays on its edge, as a TCP connection stays with the one server it reached.

What it stands for: plain HTTP downloads through the hub's bridge (CloudFront over S3) met edges capped at 8.7 MB/s
per connection on 65 to 75% of requests, about 67 to 69 MB/s on the rest, and each request can land on another
edge (huggingface/xet-core#821). The draw hashes the seed with the connection's first request (client address, path,
Range header) and how many times that same request was asked before, so a run draws the same edges whatever order
its threads ask in.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections import Counter
from dataclasses import dataclass, field


@dataclass
class Edges:
    """`slow_share` of the requests are capped at `fast_rate * slow_factor` bytes/s per connection, the rest at
    `fast_rate` (None: uncapped)."""

    slow_share: float = 0.0
    slow_factor: float = 1 / 8
    fast_rate: float | None = None
    seed: int = 0
    asked: Counter = field(default_factory=Counter)
    drawn: Counter = field(default_factory=Counter)  # "slow" / "fast" -> requests
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        if not 0.0 <= self.slow_share <= 1.0:
            raise ValueError(f"slow_share {self.slow_share} is not between 0 and 1")
        if not 0.0 < self.slow_factor <= 1.0:
            raise ValueError(f"slow_factor {self.slow_factor} is not in (0, 1]")
        if self.slow_share and not self.fast_rate:
            raise ValueError("slow edges need the fast edges' rate (fast_rate) to be a fraction of")

    def draw(self, client: str, path: str, range_header: str) -> float | None:
        """The cap of the edge this request landed on, bytes/s per connection (None: uncapped)."""
        key = f"{client} {path} {range_header}"
        with self.lock:
            nth = self.asked[key]
            self.asked[key] += 1
        digest = hashlib.sha256(f"{self.seed} {key} {nth}".encode()).digest()
        slow = int.from_bytes(digest[:8], "big") / 2**64 < self.slow_share
        with self.lock:
            self.drawn["slow" if slow else "fast"] += 1
        if self.fast_rate is None:
            return None
        return self.fast_rate * self.slow_factor if slow else self.fast_rate


class ConnectionPace:
    """Holds a connection's chunks to its edge's cap; a twentieth of a second of unused budget may be spent late, so
    a thread woken late on a busy machine does not fall below the cap (and an idle connection does not burst)."""

    def __init__(self, rate: float | None) -> None:
        self.rate = rate
        self.next_slot = time.monotonic()

    def wait(self, nbytes: int) -> None:
        if not self.rate:
            return
        now = time.monotonic()
        start = max(now - 0.05, self.next_slot)
        self.next_slot = start + nbytes / self.rate
        if self.next_slot > now:
            time.sleep(self.next_slot - now)


class ClientPace:
    """Holds a chunk for a client until its share of the per-client rate allows it: all of one address's connections
    draw on one budget, as a hub's per-client limit does."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._next_slot: dict[str, float] = {}

    def wait(self, client: str, nbytes: int, rate: float | None) -> None:
        if not rate:
            return
        with self._lock:
            now = time.monotonic()
            # A quarter second of unused budget may be spent late, so a thread that wakes up late on a busy machine
            # does not lower the long-run rate below the cap (nor raise it above).
            start = max(now - 0.25, self._next_slot.get(client, 0.0))
            self._next_slot[client] = start + nbytes / rate
        delay = start + nbytes / rate - now
        if delay > 0:
            time.sleep(delay)
