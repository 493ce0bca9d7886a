"""One file from the hub written as byte ranges that tile it (kimi_cluster/node/weights_ranges.py streams them), with
its one hash computed in order: the stream whose range holds the hashed prefix's end hashes its chunks as it writes
them; bytes of a later range, written while an earlier one was still running, are read back from the page cache once
the prefix reaches them (`reread` counts them), so no byte is asked of the hub twice and the file still has one
sha256 to compare with the manifest.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass

from kimi_cluster.node.weights_files import CHUNK, Corrupt, Counters, Entry

# No range is cut into parts smaller than this: below it a new stream's open costs more than it saves.
MIN_SPLIT_BYTES = CHUNK // 4
READ_BACK = 8 * CHUNK  # the block the hash reads back from the page cache


class Abandoned(Exception):
    """Another range of the same file failed: this one stops, and the file is settled by that failure."""


@dataclass
class Range:
    """Bytes [start, end) of a file, fetched by one stream at a time."""

    start: int
    end: int  # exclusive; lowered when the range is split
    pos: int  # bytes [start, pos) are written
    claimed: int  # [pos, claimed) are being written by the range's stream; a split never cuts below it
    rate: float = 0.0  # bytes/s its stream reached over its last window (0: not measured yet)
    asked: int = 0  # the end of the block its stream asked for: a split never cuts below it either

    def held(self) -> int:
        """The end of what the range's stream has claimed or asked for."""
        return min(self.end, max(self.claimed, self.asked))


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
        # The last stream has verified and committed the file, or given it up: only then may the scheduler forget it
        # (at outstanding 0 the file may still be verifying, not yet done; started again then, it was fetched twice).
        self.settled = False
        self.cdn_url: str | None = None  # where the hub redirected this file's bytes

    def slowest(self, fast: float) -> tuple[float, Range] | None:
        """(seconds left, range) of the range that will end last at its stream's rate (`fast` for one not measured
        yet), among those with enough left to cut; None if none has."""
        with self.lock:
            if self.failed:
                return None
            candidates = [((r.end - r.held()) / (r.rate or fast), r) for r in self.ranges
                          if r.end - r.held() >= 2 * MIN_SPLIT_BYTES]
        return max(candidates, key=lambda c: c[0]) if candidates else None

    def split(self, r: Range, fast: float) -> Range | None:
        """Cut r where its stream, at its rate, and a new stream at `fast` would end together, and return the second
        part as a new range for that new stream (halves when r's rate is not known). None if too small to cut."""
        with self.lock:
            held = r.held()
            left = r.end - held
            share = r.rate / (r.rate + max(fast, r.rate)) if r.rate else 0.5
            keep = max(MIN_SPLIT_BYTES, min(left - MIN_SPLIT_BYTES, int(left * share)))
            if self.failed or left < 2 * MIN_SPLIT_BYTES:
                return None
            mid = held + keep
            new = Range(mid, r.end, mid, mid)
            r.end = mid
            self.ranges.append(new)
            self.ranges.sort(key=lambda x: x.start)
            self.outstanding += 1
            return new

    def ask(self, r: Range, block: int) -> int:
        """The end of r's next block of `block` bytes, recorded before it is asked for (a split respects it)."""
        with self.lock:
            r.asked = min(r.end, r.pos + block)
            return r.asked

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
