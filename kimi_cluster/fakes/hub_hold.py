"""The fake hub's hold (kimi_cluster/fakes/hub.py): a test that must look at a download while it is under way holds
every file body at its middle (its first half sent) and releases them once it has seen what it waits for, instead of
guessing how slow a body must be for a loaded machine to catch it mid-way.

A body holds for as long as the test takes, so a client's read timeout can pass meanwhile: it resumes as from any
stalled server, with a Range request, which is held again at its own middle until the release.
"""

from __future__ import annotations

import fnmatch
import threading

# The fake's own controls (POST, empty body; not hub routes): hold every file body at its middle, release them.
HOLD_PATH = "/_fake/hold"
RELEASE_PATH = "/_fake/release"


class Hold:
    """Released (bodies flow) until hold(); `waiting` counts the bodies stopped at their middle right now."""

    def __init__(self) -> None:
        self._released = threading.Event()
        self._released.set()
        self._lock = threading.Lock()
        self.waiting = 0
        self.only = "*"  # the files held (a glob of their path): a test may let the small ones, config.json, through

    @property
    def holding(self) -> bool:
        return not self._released.is_set()

    def hold(self, only: str = "*") -> None:
        self.only = only
        self._released.clear()

    def release(self) -> None:
        self._released.set()

    def at_middle(self, path: str) -> None:
        """The body of the file at `path` at its middle: wait here while held."""
        if not self.holding or not fnmatch.fnmatchcase(path, self.only):
            return
        with self._lock:
            self.waiting += 1
        try:
            self._released.wait()
        finally:
            with self._lock:
                self.waiting -= 1


def pieces(limit: int, step: int) -> list[tuple[int, int]]:
    """(start, end) of each write of a body of `limit` bytes, `step` at most: one starts at the middle, where a held
    hub stops the body."""
    middle, at, out = limit // 2, 0, []
    while at < limit:
        end = min(at + step, limit)
        end = middle if at < middle < end else end
        out.append((at, end))
        at = end
    return out
