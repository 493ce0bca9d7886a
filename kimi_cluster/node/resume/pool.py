"""The replicas this front balances over, and whether each may take a request.

Each replica's `GET /health` is asked every `interval_s` (at most `timeout_s` for an answer): `fails` misses in a row
mark it down, `passes` good answers in a row mark it up again, as the front's Caddy does. A replica that lost a
request (a reset, an end before the finish, silence while it is down) is marked down at once and gets no new request
until its health check passes again. New requests go to the healthy replica with the fewest in flight.

The list can change while requests run (`set_urls`: a replica re-created at a new address): a replica that stays
keeps its state, a new one takes requests once its health check passes, and one that goes takes no new request
while those it carries finish.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from . import wire


@dataclass(eq=False)  # one object per replica: compared by identity
class Replica:
    url: str
    host: str
    port: int
    healthy: bool = True  # until its checks say otherwise: a front starts after its replicas serve
    fails: int = 0
    passes: int = 0
    in_flight: int = 0
    picked: int = 0  # how many requests it was given: a tie of in_flight goes to the one given fewer
    generating: int = 0  # of in_flight, the generations through the token API (those a loss carries on)


class Pool:
    def __init__(self, urls: list[str], interval_s: float = 1.0, timeout_s: float = 1.0, fails: int = 2,
                 passes: int = 2) -> None:
        if not urls:
            raise ValueError("at least one replica is needed")
        self.replicas = [Replica(url, *wire.address(url)) for url in urls]
        self.interval_s, self.timeout_s, self.fails, self.passes = interval_s, timeout_s, fails, passes
        self.changed = threading.Condition()
        self.stop = threading.Event()
        self.started = False

    def start(self) -> None:
        self.started = True
        for replica in self.replicas:
            self._start_watch(replica)

    def _start_watch(self, replica: Replica) -> None:
        threading.Thread(target=self._watch, args=(replica,), name=f"health {replica.url}", daemon=True).start()

    def urls(self) -> list[str]:
        with self.changed:
            return [r.url for r in self.replicas]

    def set_urls(self, urls: list[str]) -> None:
        """The replicas are now these (in this order); see the module's docstring."""
        if not urls:
            raise ValueError("at least one replica is needed")
        with self.changed:
            kept = {r.url: r for r in self.replicas}
            added = [Replica(url, *wire.address(url), healthy=False) for url in urls if url not in kept]
            new = {r.url: r for r in added}
            gone = [url for url in kept if url not in urls]
            self.replicas = [kept.get(url) or new[url] for url in urls]
            self.changed.notify_all()
        for replica in added if self.started else ():
            self._start_watch(replica)
        if added or gone:
            log(f"replicas now {', '.join(urls)}" + (f" (gone: {', '.join(gone)})" if gone else ""))

    def _watch(self, replica: Replica) -> None:
        while not self.stop.is_set() and replica in self.replicas:
            started = time.monotonic()
            self.record(replica, self._check(replica))
            self.stop.wait(max(0.0, self.interval_s - (time.monotonic() - started)))

    def _check(self, replica: Replica) -> bool:
        try:
            up = wire.send(replica.host, replica.port, "GET", "/health", connect_timeout_s=self.timeout_s)
        except wire.Lost:
            return False
        try:
            up.read_head(self.timeout_s)
            return up.status == 200
        except (wire.Lost, wire.Quiet, ValueError):
            return False
        finally:
            up.close()

    def record(self, replica: Replica, good: bool) -> None:
        """One health answer: the replica goes down after `fails` misses in a row, up after `passes` good ones."""
        with self.changed:
            if good:
                replica.fails, replica.passes = 0, replica.passes + 1
                if not replica.healthy and replica.passes >= self.passes:
                    replica.healthy = True
                    log(f"replica {replica.url} is back: {replica.passes} good health checks in a row")
            else:
                replica.passes, replica.fails = 0, replica.fails + 1
                if replica.healthy and replica.fails >= self.fails:
                    replica.healthy = False
                    log(f"replica {replica.url} is down: {replica.fails} health checks missed in a row")
            self.changed.notify_all()

    def mark_lost(self, replica: Replica, why: str) -> None:
        """A request lost on this replica: no new request goes there until its health check passes again."""
        with self.changed:
            if replica.healthy:
                log(f"replica {replica.url} is down: {why}")
            replica.healthy, replica.passes = False, 0
            self.changed.notify_all()

    def passes_check(self, replica: Replica) -> bool:
        """Ask the replica's health now, once (an engine that died answers 503 at once); a miss marks it lost."""
        if self._check(replica):
            return True
        self.mark_lost(replica, "its health check fails")
        return False

    def is_down(self, replica: Replica) -> bool:
        with self.changed:
            return not replica.healthy

    def pick(self, exclude: tuple[Replica, ...] = (), wait_s: float = 0.0) -> Replica | None:
        """The healthy replica (not in exclude) with the fewest requests in flight, waiting up to wait_s for one;
        counted in flight until `release`."""
        deadline = time.monotonic() + wait_s
        with self.changed:
            while True:
                ready = [r for r in self.replicas if r.healthy and r not in exclude]
                if ready:
                    chosen = min(ready, key=lambda r: (r.in_flight, r.picked))
                    chosen.in_flight += 1
                    chosen.picked += 1
                    return chosen
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self.changed.wait(left)

    def release(self, replica: Replica) -> None:
        with self.changed:
            replica.in_flight -= 1

    @contextmanager
    def holding(self, replica: Replica, generating: bool = False) -> Iterator[Replica]:
        """The replica, released on the way out; `generating`: counted as a generation meanwhile."""
        if generating:
            with self.changed:
                replica.generating += 1
        try:
            yield replica
        finally:
            if generating:
                with self.changed:
                    replica.generating -= 1
            self.release(replica)

    def generations(self) -> dict[str, int]:
        """The generations running on each replica (the front's /health shows them)."""
        with self.changed:
            return {r.url: r.generating for r in self.replicas}


def log(message: str) -> None:
    """One line of resume.log. What came from a client or an upstream is escaped: no control character reaches the
    operator's terminal, and no line break forges a line."""
    print(f"kimi-resume: {printable(message)}", flush=True)


def printable(text: str, limit: int = 500) -> str:
    """text with every character that is not printable written as its escape, cut at limit characters."""
    out = "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text[:limit])
    return out + ("..." if len(text) > limit else "")
