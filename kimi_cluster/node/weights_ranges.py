"""The weights program's hub streams (run with kimi_cluster/node/fetch_weights.py): one file as one or more byte
ranges, each its own stream with a floor, hashed in order into the file's one hash.

The hub serves through a CDN whose edges differ: 65 to 75% of CloudFront's edges behind the hub's bridge capped a
connection at 8.7 MB/s while the rest gave about 68 MB/s, and each request may land on another edge
(huggingface/xet-core#821). A stream on a capped edge never stalls (bytes keep coming), so a stall timeout never
fires, and one such stream sets the tail of a node's download. Two things keep it from doing so:

- **A floor per stream.** Each stream's rate over its last window is compared with a floor: a share of the fastest
  rate its siblings (the node's other hub streams) reach over their own windows, never below a minimum. A stream
  below its floor for a whole window, with more than a window's work left at its own rate, is re-opened on a new
  connection with a Range request from the byte it has reached; what it wrote and hashed stays. Each re-open of the
  same range lengthens its window by one more window; after MAX_REOPENS the range keeps the edge it has (it still
  finishes, and the tail split below may still take half of it).
- **The tail is split.** When no whole file is left to start, a free stream takes the second half of the range with
  the most bytes left (`Transfer.split`); the two ranges go on in parallel, each on its own connection. The hub's
  connections stay at most `--workers`.

The file's hash stays one in-order hash: the stream whose range holds the hashed prefix's end hashes its chunks as
it writes them; bytes of a later range, written while an earlier one was still running, are read back from the
page cache once the prefix reaches them (`reread` counts them). No byte is fetched twice.
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import httpx2
from huggingface_hub import hf_hub_url

from kimi_cluster.node.weights_files import (
    CHUNK,
    HUB_ATTEMPTS,
    Cache,
    Corrupt,
    Counters,
    Entry,
    Fatal,
    log,
)

# Re-opens of one range for its floor, after which it keeps its edge: at 70% capped edges, 0.7^9 = 4% of ranges get
# here, and the tail split still halves them.
MAX_REOPENS = 8
# A window is at least this many times the stream's own time to open (request to first byte, redirect included):
# a re-open then costs at most a tenth of the window it replaces.
WINDOW_PER_OPEN = 10
# No range smaller than this is split off: below it the new stream's open costs more than it saves.
MIN_SPLIT_BYTES = 2 * CHUNK
READ_BACK = 8 * CHUNK  # the block the hash reads back from the page cache


class Abandoned(Exception):
    """Another range of the same file failed: this one stops, and the file is settled by that failure."""


@dataclass(frozen=True)
class Floor:
    """The rule each hub stream is held to (fetch_weights' --hub-min-rate, --hub-floor-share, --hub-window)."""

    min_rate: float  # bytes/s: the floor never goes below it, even when every sibling is slow
    share: float  # of the fastest sibling's recent rate
    window_s: float  # the least time a stream's rate is measured over before it is judged


class Rates:
    """The recent rate of every live hub stream of this node, for the floor of each."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.recent: dict[int, float] = {}
        self.reopens = 0  # re-opens for the floor, this run (reported in the progress line)

    def report(self, stream: int, rate: float) -> None:
        with self.lock:
            self.recent[stream] = rate

    def forget(self, stream: int) -> None:
        with self.lock:
            self.recent.pop(stream, None)

    def fastest_sibling(self, stream: int) -> float:
        with self.lock:
            return max((r for s, r in self.recent.items() if s != stream), default=0.0)


@dataclass
class Range:
    start: int
    end: int  # exclusive; lowered when the range is split
    pos: int  # bytes [start, pos) are written
    claimed: int  # [pos, claimed) are being written by the range's stream; a split never cuts below it


class Transfer:
    """One file from the hub into its .incomplete, as ranges that tile it; its hash covers a prefix, in order."""

    def __init__(self, e: Entry, tmp: str, counters: Counters) -> None:
        self.e, self.tmp, self.counters = e, tmp, counters
        self.fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        self.lock = threading.Lock()
        self.ranges = [Range(0, e.size, 0, 0)]
        self.hasher = e.hasher()
        self.hashed = 0
        self.catching = False
        self.reread = 0
        self.outstanding = 1  # ranges whose stream has not ended
        self.failed = False
        self.finished = False

    def left(self) -> int:
        with self.lock:
            return sum(r.end - r.claimed for r in self.ranges)

    def split(self) -> Range | None:
        """The second half of the range with the most bytes left, as a new range for another stream (None if
        every range is too small to halve)."""
        with self.lock:
            if self.failed:
                return None
            r = max(self.ranges, key=lambda r: r.end - r.claimed)
            left = r.end - r.claimed
            if left < 2 * MIN_SPLIT_BYTES:
                return None
            mid = r.claimed + (left // 2 // CHUNK) * CHUNK
            new = Range(mid, r.end, mid, mid)
            r.end = mid
            self.ranges.append(new)
            self.ranges.sort(key=lambda x: x.start)
            self.outstanding += 1
            return new

    def write(self, r: Range, chunk: bytes) -> int:
        """Write what of `chunk` belongs to r at r.pos; the bytes accepted (fewer once r reached its end)."""
        with self.lock:
            if self.failed:
                raise Abandoned(self.e.name)
            off = r.pos
            n = min(len(chunk), r.end - off)
            if n <= 0:
                return 0
            r.claimed = off + n
        data = chunk[:n] if n < len(chunk) else chunk
        os.pwrite(self.fd, data, off)
        with self.lock:
            r.pos = off + n
            if off == self.hashed and not self.catching:
                self.hasher.update(data)
                self.hashed += n
            catch_up = not self.catching and self._frontier() > self.hashed
            if catch_up:
                self.catching = True
        self.counters.add(self.e.name, n, True)
        if catch_up:
            self._catch_up()
        return n

    def _frontier(self) -> int:
        """The end of the written prefix that starts at the hashed prefix's end (under the lock)."""
        f = self.hashed
        for r in self.ranges:
            if r.start <= f < r.end:
                f = r.pos
                if r.pos < r.end:
                    break
        return f

    def _catch_up(self) -> None:
        """Hash, in order, what later ranges wrote before the prefix reached them, read back from the page cache."""
        while True:
            with self.lock:
                start, frontier = self.hashed, self._frontier()
                if frontier <= start or self.failed:
                    self.catching = False
                    return
            view = os.pread(self.fd, min(READ_BACK, frontier - start), start)
            with self.lock:
                self.hasher.update(view)
                self.hashed = start + len(view)
                self.reread += len(view)

    def end_range(self, ok: bool) -> bool:
        """One range's stream ended (a failure abandons the other ranges); True for the stream that ended last,
        which then settles the file: `verify` if nothing failed (the prefix is hashed to the end by then)."""
        with self.lock:
            self.outstanding -= 1
            self.failed = self.failed or not ok
            last = self.outstanding == 0
        if last and not self.failed:
            self._catch_up()
        elif last:
            os.close(self.fd)
        return last

    def verify(self) -> None:
        """The whole file's one hash against the manifest (Corrupt on a mismatch); closes the file."""
        try:
            if self.hashed != self.e.size:
                raise Corrupt(f"{self.e.name}: {self.hashed:,} of {self.e.size:,} bytes hashed")
            digest = self.hasher.hexdigest()
            if digest != self.e.etag:
                raise Corrupt(f"{self.e.name}: hashes to {digest[:16]}... but the hub records {self.e.etag[:16]}...")
        finally:
            os.close(self.fd)


class _Reopen(Exception):
    """This stream is below its floor: a new connection takes the range on from where it stands."""


def stream_range(new_client: Callable[[], httpx2.Client], url: str, headers: dict[str, str], t: Transfer, r: Range,
                 floor: Floor, rates: Rates, stream_id: int) -> None:
    """Fetch range r of t from the hub: a dropped connection resumes with a Range request (HUB_ATTEMPTS in all), a
    stream below its floor re-opens on a new connection (MAX_REOPENS); the range ends at r.end, which a split
    may lower while it runs."""
    e = t.e
    attempt, reopens = 1, 0
    open_s = 0.0
    while r.pos < r.end:
        window = max(floor.window_s, WINDOW_PER_OPEN * open_s) * (1 + reopens)
        client = new_client()  # a new connection each time: a re-open must leave the edge it was on
        try:
            opened = time.monotonic()
            hdrs = {**headers, "Range": f"bytes={r.pos}-{r.end - 1}"}
            with client.stream("GET", url, headers=hdrs) as resp:
                if resp.status_code in (401, 403, 404):
                    raise Fatal(f"{e.name}: HTTP {resp.status_code} from {url.split('?')[0]}")
                whole = resp.status_code == 200 and r.pos == 0  # a server may answer a range of all bytes so
                if not whole and (resp.status_code != 206
                                  or not resp.headers.get("Content-Range", "").startswith(f"bytes {r.pos}-")):
                    # A 200 past byte 0 would be the whole file again (the CDN honours ranges): retried.
                    raise httpx2.HTTPStatusError(f"HTTP {resp.status_code} without the range asked for",
                                                 request=resp.request, response=resp)
                open_s = time.monotonic() - opened
                window = max(floor.window_s, WINDOW_PER_OPEN * open_s) * (1 + reopens)
                samples: deque[tuple[float, int]] = deque([(time.monotonic(), 0)])
                got = 0
                for chunk in resp.iter_bytes(CHUNK):
                    n = t.write(r, chunk)
                    got += n
                    if r.pos >= r.end:
                        break  # the range is whole (or a split gave its rest to another stream)
                    if n < len(chunk):
                        raise Corrupt(f"{e.name}: more bytes than the range {r.start:,}-{r.end - 1:,} asked for")
                    now = time.monotonic()
                    samples.append((now, got))
                    while len(samples) > 2 and now - samples[1][0] >= window:
                        samples.popleft()
                    span = now - samples[0][0]
                    if span < window:
                        continue  # not judged before a whole window
                    rate = (got - samples[0][1]) / span
                    rates.report(stream_id, rate)
                    limit = max(floor.min_rate, floor.share * rates.fastest_sibling(stream_id))
                    if rate < limit and reopens < MAX_REOPENS and (r.end - r.pos) / max(rate, 1.0) > window:
                        raise _Reopen(f"{rate / 1e6:,.2f} MB/s under its floor of {limit / 1e6:,.2f} MB/s "
                                      f"for {span:,.1f} s")
            if r.pos < r.end:
                raise httpx2.RemoteProtocolError(f"{e.name}: range ended at {r.pos:,} of {r.start:,}-{r.end - 1:,}")
        except _Reopen as why:
            reopens += 1
            with rates.lock:
                rates.reopens += 1
            log(f"{e.name}: {why}; re-opening from byte {r.pos:,} on a new connection (re-open {reopens})")
        except (httpx2.TransportError, httpx2.HTTPStatusError) as exc:
            if attempt >= HUB_ATTEMPTS:
                raise
            attempt += 1
            log(f"{e.name}: {type(exc).__name__} at byte {r.pos:,}; resuming (attempt {attempt})")
            time.sleep(min(2**attempt, 30))
        finally:
            client.close()
            rates.forget(stream_id)


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

    def client(self) -> httpx2.Client:
        """A client of its own for one stream, so that a re-open is a new connection (a new CDN edge)."""
        a = self.args
        transport = httpx2.HTTPTransport(local_address=a.source_address, verify=self.ssl_context) \
            if a.source_address else None
        # The hub redirects file bodies to its CDN; httpx2 drops the Authorization header when the host changes.
        return httpx2.Client(follow_redirects=True, transport=transport, verify=self.ssl_context,
                             timeout=httpx2.Timeout(30.0, read=a.stall_seconds))

    def start(self, e: Entry) -> tuple[Transfer, Range]:
        """A new file: its transfer and its one range, the whole file."""
        t = self.transfers[e.name] = Transfer(e, self.cache.blob(e) + ".incomplete", self.counters)
        return t, t.ranges[0]

    def split(self) -> tuple[Transfer, Range] | None:
        """The second half of the range with the most bytes left, over every file in flight (None: none to split)."""
        live = [t for t in self.transfers.values() if not t.failed]
        widest = max(live, key=Transfer.left) if live else None
        half = widest.split() if widest else None
        return (widest, half) if widest and half else None

    def ended(self, name: str) -> bool:
        """Whether every range of the file has ended (its last stream settled it); forgets it then."""
        t = self.transfers.get(name)
        if t is not None and t.outstanding:
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
            stream_range(self.client, url, self.headers, t, r, self.floor, self.rates, stream_id)
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

    def summary(self) -> str:
        """What the progress line adds about re-opens and the split tail."""
        return ((f"; {self.rates.reopens} hub streams re-opened below their floor" if self.rates.reopens else "")
                + (f"; {self.reread / 1e9:,.2f} GB of split-off ranges hashed from the page cache"
                   if self.reread else ""))
