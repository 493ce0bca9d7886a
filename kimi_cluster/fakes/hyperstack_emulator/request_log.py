"""The emulator's request log: every request to the API, as it arrived and how it was answered (a test reads it
through `Emulator.requests` and `Emulator.calls`, or GET /_emulator/requests from another process)."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from .faults import matches


@dataclass
class RecordedRequest:
    method: str
    path: str  # after /v1, without the query
    query: dict[str, list[str]]
    body: Any
    authorized: bool
    status: int = 0  # the answer's status once answered; -1 when the connection was dropped


class RequestLog:
    def __init__(self, lock: threading.RLock) -> None:
        self._lock = lock
        self._requests: list[RecordedRequest] = []

    def append(self, record: RecordedRequest) -> None:
        with self._lock:
            self._requests.append(record)

    def all(self) -> list[RecordedRequest]:
        with self._lock:
            return list(self._requests)

    def calls(self, method: str | None = None, path: str | None = None) -> list[RecordedRequest]:
        return [r for r in self.all() if matches(r.method, r.path, method, path)]

    def clear(self) -> None:
        with self._lock:
            self._requests.clear()
