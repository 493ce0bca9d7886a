"""vLLM's render servers on the front, as the resuming layer calls them.

The resume step changes the render server without a gap (kimi_cluster/plan/templates/resume.sh.j2): the new one
starts on the spare port while the old one still serves, and the old one is removed only once the new one answers.
So the layer knows both addresses and calls the one that answered last; when that one cannot be reached or answers
5xx, it calls the other at once. Each call is whole (a render, or a derender carrying the stream so far: vLLM's
derender is stateless), so either server can take any call.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from . import wire


class RenderServers:
    """The render servers' addresses, the one that answered last first."""

    def __init__(self, addresses: Sequence[tuple[str, int]]) -> None:
        if not addresses:
            raise ValueError("at least one render server is needed")
        self.addresses = list(addresses)
        self._current = 0
        self._lock = threading.Lock()

    def call(self, path: str, payload: Any, timeout_s: float) -> tuple[int, Any, bytes]:
        """(status, parsed JSON or None, raw body) from the first server that answers below 500, the last one to
        answer tried first. When none does: the last answer, or 503 with why the last server could not be reached
        (the callers treat both as the server being away)."""
        with self._lock:
            first = self._current
        answer: tuple[int, Any, bytes] = (503, None, b"no render server answered")
        for step in range(len(self.addresses)):
            at = (first + step) % len(self.addresses)
            try:
                answer = wire.call_json(*self.addresses[at], path, payload, timeout_s)
            except wire.Lost as exc:
                answer = (503, None, str(exc).encode())
                continue
            if answer[0] < 500:
                with self._lock:
                    self._current = at
                return answer
        return answer

    def __str__(self) -> str:
        return ", ".join(f"http://{host}:{port}" for host, port in self.addresses)
