"""A total deadline per check, not per read.

requests' `timeout` bounds each socket read, so a server that trickles one byte at a time, in its
headers or its body, holds a check for as long as it likes
(https://requests.readthedocs.io/en/latest/user/advanced/#timeouts). Here each check gets one
Deadline: every request it makes uses the time left as its connect and read timeout, and a timer
shuts down the socket of the request in flight when the time is up, which ends any blocked read
at once. The sockets are found through the transport adapter that `use_deadlines` mounts on the
check's session; its connection classes hand each socket to the Deadline that is active in the
calling thread.
"""

from __future__ import annotations

import contextvars
import socket
import threading
import time
from types import TracebackType
from typing import Any

from requests import Session
from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool
from urllib3.poolmanager import PoolManager

_ACTIVE: contextvars.ContextVar[Deadline | None] = contextvars.ContextVar("verification_deadline", default=None)


class Deadline:
    """The time one check may take in total; `with Deadline(s):` makes it the active one."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._end = time.monotonic() + seconds
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._expired = False
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True
        self._token: contextvars.Token[Deadline | None] | None = None

    def __enter__(self) -> Deadline:
        self._token = _ACTIVE.set(self)
        self._timer.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._timer.cancel()
        with self._lock:
            self._sockets.clear()
        if self._token is not None:
            _ACTIVE.reset(self._token)

    def remaining(self) -> float:
        return max(0.0, self._end - time.monotonic())

    @property
    def expired(self) -> bool:
        return self._expired or self.remaining() <= 0

    @property
    def cut_off(self) -> bool:
        """True once the timer has shut the sockets: what was read since may be truncated, since
        http.client takes an early end of the headers for their end."""
        return self._expired

    def watch(self, sock: socket.socket | None) -> None:
        """Shut `sock` down when the time is up (at once if it already is)."""
        if sock is None:
            return
        with self._lock:
            if not self._expired:
                if sock not in self._sockets:
                    self._sockets.append(sock)
                return
        _shutdown(sock)

    def _expire(self) -> None:
        with self._lock:
            self._expired = True
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            _shutdown(sock)


def _shutdown(sock: socket.socket) -> None:
    # shutdown, unlike close, wakes a recv() blocked in another thread
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # already closed by the other side or by urllib3


def _watch_active(sock: Any) -> None:
    deadline = _ACTIVE.get()
    if deadline is not None:
        deadline.watch(sock)


class _WatchedHTTPConnection(HTTPConnection):
    def connect(self) -> None:
        super().connect()
        _watch_active(self.sock)

    def request(self, *args: Any, **kwargs: Any) -> None:
        _watch_active(self.sock)  # a kept-alive connection does not connect again (a new one has no socket yet)
        super().request(*args, **kwargs)


class _WatchedHTTPSConnection(HTTPSConnection):
    def connect(self) -> None:
        super().connect()
        _watch_active(self.sock)

    def request(self, *args: Any, **kwargs: Any) -> None:
        _watch_active(self.sock)  # as above
        super().request(*args, **kwargs)


class _WatchedHTTPPool(HTTPConnectionPool):
    ConnectionCls = _WatchedHTTPConnection


class _WatchedHTTPSPool(HTTPSConnectionPool):
    ConnectionCls = _WatchedHTTPSConnection


_POOLS = {"http": _WatchedHTTPPool, "https": _WatchedHTTPSPool}


def _use_watched_pools(manager: PoolManager) -> PoolManager:
    manager.pool_classes_by_scheme = _POOLS
    return manager


class DeadlineAdapter(HTTPAdapter):
    """requests' adapter whose connections hand their sockets to the active Deadline."""

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        super().init_poolmanager(*args, **kwargs)
        _use_watched_pools(self.poolmanager)

    def proxy_manager_for(self, proxy: str, **proxy_kwargs: Any) -> Any:
        manager = super().proxy_manager_for(proxy, **proxy_kwargs)
        if not proxy.lower().startswith("socks"):  # SOCKS pools bring their own connection classes
            _use_watched_pools(manager)
        return manager


def use_deadlines(session: Session) -> None:
    """Make `session`'s http:// and https:// connections hand their sockets to the active Deadline.

    requests' own default adapter is replaced by a DeadlineAdapter. An adapter of the caller's own (one that sets up
    TLS, say) is kept as it is configured, and only its connection classes are swapped; a subclass of
    DeadlineAdapter is left alone.
    """
    for prefix in ("http://", "https://"):
        current = session.adapters.get(prefix)
        if isinstance(current, DeadlineAdapter):
            continue
        if type(current) is HTTPAdapter or current is None:
            if current is not None:
                current.close()
            session.mount(prefix, DeadlineAdapter())
        elif isinstance(current, HTTPAdapter):
            _use_watched_pools(current.poolmanager)
