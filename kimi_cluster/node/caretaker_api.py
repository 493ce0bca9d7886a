"""The Hyperstack API as the caretaker (kimi_cluster/node/caretaker.py) calls it: standard library only, shipped beside
it (kimi_cluster/plan/templates/caretaker.sh.j2) as kimi_cluster/node/caretaker_spend.py is.

Its key is the whole account's, so a call follows no redirect (urllib would copy the api_key header to wherever the
answer points, from https to plain http too); and one malformed or endless answer must not stop the caretaker from
deciding, so every call has an overall deadline and a cap on what it reads, and whatever goes wrong in it is an
ApiError, the one failure its callers handle.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

RATE_LIMIT_TRIES = 5  # Hyperstack's guidance: wait >= 1 s, double each retry, stop after 5
API_DEADLINE_S = 60.0  # one call, from connecting to its last byte
API_READ_MAX = 16 * 1024 * 1024  # bytes of one answer: a page of 100 VMs or billing entries is far below 1 MB


class ApiError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


def log(text: str) -> None:
    print(f"[{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}] {text}", flush=True)


# ---- the API ---------------------------------------------------------------------------------------------------------

class _Deadline:
    """One call's overall deadline: when it passes, every socket of the call is shut down, so that an answer that
    trickles in (each read within the socket timeout) ends the call with an error instead of holding the poll."""

    def __init__(self, seconds: float) -> None:
        self.sockets: list[socket.socket] = []
        self.expired = False
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True

    def watch(self, sock: socket.socket) -> socket.socket:
        self.sockets.append(sock)
        return sock

    def _expire(self) -> None:
        self.expired = True
        for sock in self.sockets:
            try:  # the plain socket's shutdown, also for a TLS one (its own would drop its state under the reader)
                socket.socket.shutdown(sock, socket.SHUT_RDWR)
            except OSError:
                pass

    def __enter__(self) -> _Deadline:
        self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._timer.cancel()


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect is an API error: urllib would send every header, the api_key included, to the new location (from
    https to plain http too)."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def _opener(deadline: _Deadline) -> urllib.request.OpenerDirector:
    """urllib's opener whose connections the deadline watches, and that follows no redirect."""

    def watched(base: type[http.client.HTTPConnection]) -> Any:
        class Watched(base):  # type: ignore[valid-type,misc]  # a subclass of the class given, made per call
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(*args, **kwargs)
                self._create_connection = lambda *a, **k: deadline.watch(socket.create_connection(*a, **k))

            def connect(self) -> None:
                super().connect()
                deadline.watch(self.sock)  # the TLS socket that took the plain one's descriptor
        return Watched

    class Http(urllib.request.HTTPHandler):
        def http_open(self, req: Any) -> Any:
            return self.do_open(watched(http.client.HTTPConnection), req)

    class Https(urllib.request.HTTPSHandler):
        def https_open(self, req: Any) -> Any:
            return self.do_open(watched(http.client.HTTPSConnection), req, context=getattr(self, "_context", None))

    return urllib.request.build_opener(Http, Https, _NoRedirect)


def _read_capped(answer: Any, cap: int) -> bytes:
    parts, size = [], 0
    while chunk := answer.read(64 * 1024):
        size += len(chunk)
        if size > cap:
            raise ValueError(f"the answer is longer than {cap:,} bytes")
        parts.append(chunk)
    return b"".join(parts)


class Api:
    """The few calls the caretaker makes, with Hyperstack's backoff on 429 and retries of GET and DELETE on 5xx. Each
    call has an overall deadline and a cap on what it reads; it follows no redirect; whatever goes wrong in it (a
    refused connection, a malformed status line, an answer cut short, too long or not JSON) is an ApiError."""

    def __init__(self, url: str, key: str, retry_base: float = 1.0) -> None:
        self.url, self._key, self.retry_base = url.rstrip("/"), key, retry_base

    def _once(self, method: str, full: str) -> Any:
        request = urllib.request.Request(full, method=method,
                                         headers={"api_key": self._key, "Accept": "application/json"})
        with _Deadline(API_DEADLINE_S) as deadline:
            try:
                with _opener(deadline).open(request, timeout=min(30.0, API_DEADLINE_S)) as answer:
                    return json.loads(_read_capped(answer, API_READ_MAX) or b"null")
            except urllib.error.HTTPError:
                raise
            except (OSError, http.client.HTTPException, ValueError) as err:
                if deadline.expired:
                    raise ApiError(0, f"no whole answer within {API_DEADLINE_S:g} s") from None
                raise ApiError(0, f"{type(err).__name__}: {str(err)[:300]}") from None

    def call(self, method: str, path: str, query: dict[str, str] | None = None) -> Any:
        full = self.url + path + ("?" + urllib.parse.urlencode(query) if query else "")
        delay, server_errors = self.retry_base, 0
        for attempt in range(1, RATE_LIMIT_TRIES + 2):
            try:
                body = self._once(method, full)
            except urllib.error.HTTPError as err:
                try:
                    text = err.read(2000).decode("utf-8", "replace")
                except (OSError, http.client.HTTPException):
                    text = ""
                try:
                    message = json.loads(text).get("message") or text
                except (ValueError, AttributeError):
                    message = text
                if 300 <= err.code < 400:
                    where = str(err.headers.get("Location"))[:200]
                    message = f"a redirect to {where}, which the caretaker never follows"
                if err.code == 429 and attempt <= RATE_LIMIT_TRIES:
                    log(f"the API answered 429 to {method} {path}; retrying in {delay:g} s")
                    time.sleep(delay)
                    delay *= 2
                    continue
                if err.code >= 500 and server_errors < 3:
                    server_errors += 1
                    time.sleep(delay)
                    continue
                raise ApiError(err.code, str(message)) from None
            if isinstance(body, dict) and body.get("status") is False:
                raise ApiError(200, str(body.get("message")))
            return body
        raise ApiError(429, "rate limited after 5 backoffs")

    def vm_ids(self, environment: str) -> dict[str, int]:
        """Name -> id of every VM in the environment that is not on its way out (a deleted VM stays listed, DELETING,
        for a while), page after page."""
        out: dict[str, int] = {}
        for page in range(1, 101):
            body = self.call("GET", "/core/virtual-machines", {"environment": environment, "page": str(page),
                                                               "pageSize": "100", "exact_environment_match": "true"})
            rows = body.get("instances") or []
            for vm in rows:
                if isinstance(vm, dict) and isinstance(vm.get("name"), str) and isinstance(vm.get("id"), int) \
                        and vm.get("status") not in ("DELETING", "DELETED"):
                    out[vm["name"]] = vm["id"]
            if len(rows) < 100:
                break
        return out
