"""The weights program's hub streams (run with kimi_cluster/node/fetch_weights.py): one file as one or more byte
ranges, each its own stream with a floor, hashed in order into the file's one hash.

The hub serves through a CDN whose edges differ: 65 to 75% of CloudFront's edges behind the hub's bridge capped a
connection at 8.7 MB/s while the rest gave about 68 MB/s, and each request may land on another edge
(huggingface/xet-core#821). A stream on a capped edge never stalls (bytes keep coming), so a stall timeout never
fires, and one such stream sets the tail of a node's download. So:

- **A floor per stream.** Each stream's rate over its last window (waits for an answer's headers left out) is
  compared with a floor: a share of the rate its siblings (the node's other hub streams) reached over their recent
  windows (the second fastest), never below a minimum. Its window is measured too: WINDOW_SHARE of the time its
  range has left at that same rate (or its own, if higher), never under a minimum (`--hub-window`). A stream below
  its floor for a whole window, with more than a window's work left at its own rate, is re-opened on a new
  connection with a Range request from the byte it has reached; what it wrote and hashed stays. Every third re-open
  of the same range doubles its window; after
  MAX_REOPENS the range keeps the edge it has (it still finishes, and the tail split may still take most of it).
- **Connections are kept.** A stream asks for its range a block at a time on its own kept-alive connection, which
  serves its next block, range and file unless it ended below its floor: a stream that found a fast edge stays on
  it. After the hub's first redirect of a file, its blocks go straight to the CDN's URL.
- **The tail is split.** When no whole file is left to start, a free stream takes the tail of the range that would
  end last (`Transfer.split`), cut where both streams would end together, never below the block already asked for.
  The hub's streams stay at most `--workers`, each with one connection to the hub and one to its CDN.

The file's hash stays one in-order hash: the stream whose range holds the hashed prefix's end hashes its chunks as
it writes them; bytes of a later range, written while an earlier one was still running, are read back from the
page cache once the prefix reaches them (`reread` counts them). No byte is asked for twice.
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import httpx2
from huggingface_hub import hf_hub_url

from kimi_cluster.node.weights_files import (
    CHUNK,
    HUB_ATTEMPTS,
    Cache,
    Counters,
    Entry,
    Fatal,
    log,
)
from kimi_cluster.node.weights_transfer import MIN_SPLIT_BYTES, Range, Transfer

# Re-opens of one range for its floor, after which it keeps its edge: at 70% capped edges, 0.7^9 = 4% of ranges get
# here, and the tail split still halves them. The window doubles every REOPENS_PER_DOUBLING re-opens of a range
# (0.7^3 = 34% of ranges get to a longer one), so a node whose every edge is slow stops re-opening soon.
MAX_REOPENS = 8
REOPENS_PER_DOUBLING = 3
# A stream's window is this share of the time its range has left at the rate its siblings reach: at 70% capped
# edges a stream spends 1/0.3 - 1 = 2.3 windows finding a fast one, under a tenth of the range's time at 0.04, and a
# short range (the split tail) is judged as soon as its own measure allows (Floor.window).
WINDOW_SHARE = 0.04
# A sibling's rate stays a reference this many windows after it was measured: in the tail, the fast streams have
# finished while the slow ones are still judged.
REFERENCE_WINDOWS = 8
# A stream asks for its range a block at a time, this many seconds at its rate (at most MAX_BLOCK): a split cuts at a
# block's end, so the connection is read to the end of its answer and stays alive; fewer, longer blocks cost fewer
# waits for an answer (1 s blocks once ran the 4-node benchmark 1.5-2x slower, but that was measured while the fake
# hub hashed every shard on every request, so mostly the fake's own cost; not measured again since).
BLOCK_S = 4.0
MAX_BLOCK = 256 * CHUNK
# Per stream: one connection to the hub and one to its CDN, kept while the download runs (a fast edge stays in use).
HUB_LIMITS = httpx2.Limits(max_connections=2, max_keepalive_connections=2, keepalive_expiry=60.0)


@dataclass(frozen=True)
class Floor:
    """The rule each hub stream is held to (fetch_weights' --hub-min-rate, --hub-floor-share, --hub-window)."""

    min_rate: float  # bytes/s: the floor never goes below it, even when every sibling is slow
    share: float  # of the fastest sibling's recent rate
    window_s: float  # the least time a stream's rate is measured over before it is judged

    def window(self, left: int, good_rate: float, reopens: int) -> float:
        """Seconds a stream is measured over before it is judged: WINDOW_SHARE of the time its range's `left`
        bytes take at `good_rate` (the rate its siblings reach, or its own if higher), never under window_s;
        doubled every REOPENS_PER_DOUBLING re-opens of the range, so a node whose every edge is slow stops trying."""
        derived = WINDOW_SHARE * left / max(good_rate, self.min_rate)
        return max(self.window_s, derived) * 2 ** (reopens // REOPENS_PER_DOUBLING)


class Rates:
    """The recent rate of every hub stream of this node, for the floor of each: a stream's rate stays a reference
    for a while after it ended (a fast stream may finish its range before a slow one is judged)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.recent: dict[int, tuple[float, float]] = {}  # stream -> (bytes/s over its last window, when)
        self.reopens = 0  # re-opens for the floor, this run (reported in the progress line)

    def report(self, stream: int, rate: float) -> None:
        with self.lock:
            self.recent[stream] = (rate, time.monotonic())

    def fastest_sibling(self, stream: int, within_s: float) -> float:
        """The fastest rate other streams reported in the last `within_s` seconds (0 if none did)."""
        now = time.monotonic()
        with self.lock:
            for s in [s for s, (_, at) in self.recent.items() if now - at > within_s]:
                del self.recent[s]
            others = sorted(rate for s, (rate, _) in self.recent.items() if s != stream)
        # The second fastest of three or more: one burst (a window that began with a full socket buffer) does not
        # set every sibling's floor.
        return others[-2] if len(others) >= 3 else others[-1] if others else 0.0


class Gauge:
    """A stream's rate over its last window, sampled as bytes arrive (at most 20 samples a window)."""

    def __init__(self, window_s: float) -> None:
        self.window = window_s
        self.samples: deque[tuple[float, int]] = deque([(time.monotonic(), 0)])
        self.got = 0

    def add(self, n: int) -> None:
        self.got += n
        now = time.monotonic()
        if now - self.samples[-1][0] >= self.window / 20:
            self.samples.append((now, self.got))
            while len(self.samples) > 2 and now - self.samples[1][0] >= self.window:
                self.samples.popleft()

    def rate(self, least_s: float) -> float | None:
        """Bytes/s over the last window, once at least `least_s` seconds have been measured (None before)."""
        span = self.span()
        return (self.got - self.samples[0][1]) / span if span >= least_s else None

    def span(self) -> float:
        return time.monotonic() - self.samples[0][0]

    def skip(self, seconds: float) -> None:
        """Leave out a wait that is not the edge's (asking for the next block on the same connection)."""
        self.samples = deque((t + seconds, n) for t, n in self.samples)


def _write(t: Transfer, r: Range, buf: bytearray) -> None:
    """Write what `buf` holds of r, and empty it; bytes past r.end (a split gave them to another stream, or the
    range is whole) are dropped."""
    if buf:
        t.write(r, bytes(buf))
        buf.clear()


class _Reopen(Exception):
    """This stream is below its floor: a new connection takes the range on from where it stands."""


def stream_range(client_of: Callable[[bool], httpx2.Client], url: str, headers: dict[str, str], t: Transfer, r: Range,
                 floor: Floor, rates: Rates, stream_id: int) -> bool:
    """Fetch range r of t from the hub, a block at a time on one kept-alive connection: a dropped connection
    resumes with a Range request (HUB_ATTEMPTS in all), a stream below its floor re-opens on a new connection
    (MAX_REOPENS); the range ends at r.end, which a split may lower (never below the block asked for) while it runs.
    True if the connection it ended on was below its floor when last judged."""
    e = t.e
    attempt, reopens, fresh, below = 1, 0, False, False
    gauge: Gauge | None = None
    while r.pos < r.end:
        # The stream's connection (kept alive from its last block or range: an edge found fast stays in use), or a
        # new one after a re-open or an error: a re-open must leave the edge it was on.
        client = client_of(fresh)
        if fresh:
            gauge = None  # measured anew from the new connection's first answer
        fresh = True
        # Once the hub has redirected a request of this file, its blocks go straight to the CDN's URL: one request
        # each instead of two, and none on the hub's resolver budget (huggingface/hub-docs rate-limits.md). The
        # CDN's URL is signed and expires: refused, the next attempt asks the hub again.
        cdn = t.cdn_url
        try:
            end = t.ask(r, _block(gauge, floor.min_rate))
            asked_at = time.monotonic()
            hdrs = {**({} if cdn else headers), "Range": f"bytes={r.pos}-{end - 1}"}
            with client.stream("GET", cdn or url, headers=hdrs) as resp:
                if resp.status_code in (401, 403, 404, 410) and cdn:
                    t.cdn_url = None
                    raise httpx2.HTTPStatusError(f"HTTP {resp.status_code} from the CDN (an expired URL?)",
                                                 request=resp.request, response=resp)
                if resp.status_code in (401, 403, 404):
                    raise Fatal(f"{e.name}: HTTP {resp.status_code} from {url.split('?')[0]}")
                if not cdn and resp.history:
                    t.cdn_url = str(resp.url)
                whole = resp.status_code == 200 and r.pos == 0  # a server may answer a range of all bytes so
                if not whole and (resp.status_code != 206
                                  or not resp.headers.get("Content-Range", "").startswith(f"bytes {r.pos}-")):
                    # A 200 past byte 0 would be the whole file again (the CDN honours ranges): retried.
                    raise httpx2.HTTPStatusError(f"HTTP {resp.status_code} without the range asked for",
                                                 request=resp.request, response=resp)
                # Measured from the answer's headers: opening a connection or asking for a block is not the rate.
                if gauge is None:
                    gauge, r.rate = Gauge(floor.window_s), 0.0
                else:
                    gauge.skip(time.monotonic() - asked_at)
                buf = bytearray()
                # Bytes are counted as they arrive (a capped edge's first MiB may take longer than a window) and
                # written and hashed a MiB at a time.
                for piece in resp.iter_bytes():
                    buf += piece
                    if len(buf) >= CHUNK or r.pos + len(buf) >= end:
                        _write(t, r, buf)
                        if r.pos >= end and whole:
                            break  # all it needs of a whole file's answer (a 206 ends where asked: read to its
                            # end, the connection goes back to the pool for the next block)
                    gauge.add(len(piece))
                    # A rate is a reference for the siblings after the base window, and judged after its own.
                    rate = gauge.rate(floor.window_s)
                    if rate is None:
                        continue
                    rates.report(stream_id, rate)
                    r.rate = rate
                    reference = rates.fastest_sibling(stream_id, REFERENCE_WINDOWS * gauge.window)
                    gauge.window = floor.window(r.end - r.pos, max(reference, rate), reopens)
                    if gauge.span() < gauge.window:
                        continue
                    limit = max(floor.min_rate, floor.share * reference)
                    below = rate < limit
                    if below and reopens < MAX_REOPENS and (r.end - r.pos) / max(rate, 1.0) > gauge.window:
                        _write(t, r, buf)
                        raise _Reopen(f"{rate / 1e6:,.2f} MB/s under its floor of {limit / 1e6:,.2f} MB/s "
                                      f"for {gauge.span():,.1f} s")
                _write(t, r, buf)
            if r.pos < end:
                raise httpx2.RemoteProtocolError(f"{e.name}: block ended at {r.pos:,} of {r.start:,}-{end - 1:,}")
            fresh = False  # the block is whole: its connection serves the next one
        except _Reopen as why:
            reopens += 1
            with rates.lock:
                rates.reopens += 1
            log(f"{e.name}: {why}; re-opening from byte {r.pos:,} on a new connection (re-open {reopens})")
            below = False
        except (httpx2.TransportError, httpx2.HTTPStatusError) as exc:
            if attempt >= HUB_ATTEMPTS:
                raise
            attempt += 1
            log(f"{e.name}: {type(exc).__name__} at byte {r.pos:,}; resuming (attempt {attempt})")
            time.sleep(min(2**attempt, 30))
    return below


def _block(gauge: Gauge | None, least_rate: float) -> int:
    """Bytes to ask for in one request: BLOCK_S at the rate this connection has shown so far (at the floor's minimum
    before it showed one, so a slow new connection holds little that a split cannot take), so that a split can cut
    the range at the end of the block asked for, and the connection, read to the end of its answer, stays alive."""
    rate = (gauge.rate(0.0) if gauge else None) or least_rate
    return max(MIN_SPLIT_BYTES, min(MAX_BLOCK, int(rate * BLOCK_S)))


class HubStreams:
    """This node's streams from the hub: a Transfer per file in flight, its ranges, their floor and rates."""

    def __init__(self, args: argparse.Namespace, headers: dict[str, str], cache: Cache, counters: Counters,
                 verified: Callable[[Entry], None]) -> None:
        self.args, self.headers, self.cache, self.counters, self.verified = args, headers, cache, counters, verified
        self.ssl_context = httpx2.create_ssl_context()  # one for every stream's client (it reads the CA files)
        self.floor = Floor(args.hub_min_rate, args.hub_floor_share, args.hub_window)
        self.rates = Rates()
        self.lock = threading.Lock()
        self.streams = 0  # streams started, each an id for its rate
        self.reread = 0  # bytes of split-off ranges that the in-order hash read back from the page cache
        self.transfers: dict[str, Transfer] = {}  # files in flight, by name
        # One thread and one client per stream: at most --workers streams, each with a connection to the hub and
        # one to its CDN, kept alive from range to range.
        self.pool = ThreadPoolExecutor(max_workers=args.workers, thread_name_prefix="hub")
        self.local = threading.local()
        self.clients: list[httpx2.Client] = []

    def submit(self, t: Transfer, r: Range) -> Future[None]:
        return self.pool.submit(self.fetch_range, t, r)

    def client(self, fresh: bool) -> httpx2.Client:
        """This stream's client; `fresh`: on a new connection (a new CDN edge), the old one closed."""
        old: httpx2.Client | None = getattr(self.local, "client", None)
        # A connection whose last range ended below its floor is not kept: its edge was a slow one.
        if old is not None and not fresh and not getattr(self.local, "below_floor", False):
            return old
        if old is not None:
            old.close()
        a = self.args
        transport = httpx2.HTTPTransport(local_address=a.source_address, verify=self.ssl_context,
                                         limits=HUB_LIMITS) if a.source_address else None
        # The hub redirects file bodies to its CDN; httpx2 drops the Authorization header when the host changes.
        new = self.local.client = httpx2.Client(follow_redirects=True, transport=transport, verify=self.ssl_context,
                                                limits=HUB_LIMITS, timeout=httpx2.Timeout(30.0, read=a.stall_seconds))
        with self.lock:
            self.clients = [c for c in self.clients if c is not old] + [new]
        return new

    def close(self, wait: bool) -> None:
        """Stop the streams' threads (without waiting on a failure: the files stay .incomplete) and their clients."""
        self.pool.shutdown(wait=wait, cancel_futures=True)
        if wait:
            for c in self.clients:
                c.close()

    def start(self, e: Entry) -> tuple[Transfer, Range]:
        """A new file: its transfer and its one range, the whole file."""
        t = self.transfers[e.name] = Transfer(e, self.cache.blob(e) + ".incomplete", self.counters)
        return t, t.ranges[0]

    def split(self) -> tuple[Transfer, Range] | None:
        """A new range for a free stream: the tail of the range that would end last, over every file in flight
        (None: none left to split)."""
        fast = max(self.rates.fastest_sibling(0, REFERENCE_WINDOWS * self.floor.window_s), self.floor.min_rate)
        found = [(x[0], x[1], t) for t in self.transfers.values() if (x := t.slowest(fast)) is not None]
        if not found:
            return None
        seconds, r, t = max(found, key=lambda f: f[0])
        if seconds < 2 * self.floor.window_s:
            return None  # it ends before a new stream could even be judged
        half = t.split(r, fast)
        return (t, half) if half else None

    def ended(self, name: str) -> bool:
        """Whether every range of the file has ended and its last stream settled it (verified and committed, or
        gave it up); forgets it then."""
        t = self.transfers.get(name)
        if t is not None and not t.settled:
            return False
        self.transfers.pop(name, None)
        return True

    def fetch_range(self, t: Transfer, r: Range) -> None:
        """One range of a file; the stream that ends last verifies and commits the file."""
        with self.lock:
            self.streams += 1
            stream_id = self.streams
        a = self.args
        url = hf_hub_url(a.repo, t.e.name, revision=a.revision, endpoint=a.endpoint)
        ok = False
        try:
            self.local.below_floor = stream_range(self.client, url, self.headers, t, r, self.floor, self.rates,
                                                  stream_id)
            ok = True
        finally:
            if t.end_range(ok):
                committed = False
                try:
                    if not t.failed:
                        t.verify()
                        self.cache.commit(t.e, t.tmp)
                        committed = True
                        with self.lock:
                            self.reread += t.reread
                        self.verified(t.e)
                finally:
                    self.counters.drop(t.e.name)
                    if not committed and os.path.exists(t.tmp):
                        os.unlink(t.tmp)
                    t.settled = True

    def summary(self) -> str:
        """What the progress line adds about re-opens and the split tail."""
        return ((f"; {self.rates.reopens} hub streams re-opened below their floor" if self.rates.reopens else "")
                + (f"; {self.reread / 1e9:,.2f} GB of split-off ranges hashed from the page cache"
                   if self.reread else ""))
