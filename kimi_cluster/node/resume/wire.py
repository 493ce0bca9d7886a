"""HTTP/1.1 to an upstream over a plain socket, read so that silence and loss are told apart.

http.client cannot be read with a timeout and then read on: a timeout in the middle of a chunk leaves its decoder
in an unknown state. Here every byte read is kept in a buffer and parsed only once whole, so a read that times out
(`Quiet`) loses nothing and the caller decides whether the silence is a pause or a lost replica. A reset, or an end
before the body's end, is `Lost`.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Mapping
from typing import Any

MAX_HEAD = 64 * 1024  # bytes of status line and headers
MAX_EVENT = 64 * 1024 * 1024  # bytes of one server-sent event, or one whole non-streamed body


class Lost(Exception):
    """The upstream reset the connection, ended it before the body's end, or could not be reached."""


class Quiet(Exception):
    """Nothing arrived within the read's wait; the connection is as it was."""


class Upstream:
    """One request's response from an upstream: its status and headers, then its body as it arrives."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.raw = b""  # received, not yet decoded
        self.body = b""  # decoded body, not yet consumed
        self.status = 0
        self.headers: dict[str, str] = {}
        self.chunked = False
        self.length: int | None = None  # bytes of body still due (Content-Length)
        self.chunk_left = 0  # bytes of the current chunk still due
        self.crlf_due = False  # the CRLF that ends a chunk's data
        self.done = False  # the body has ended where it said it would
        self.last_byte_at = time.monotonic()

    # ---- bytes

    def _fill(self, wait_s: float) -> None:
        """Receive what arrives within wait_s; Quiet if nothing, Lost if the connection ends or fails."""
        self.sock.settimeout(max(0.001, wait_s))
        try:
            data = self.sock.recv(65536)
        except TimeoutError:
            raise Quiet() from None
        except OSError as exc:
            raise Lost(f"connection failed: {exc}") from None
        if not data:
            if self.status and not self.chunked and self.length is None:
                self.done = True  # a body delimited by the connection's end
                return
            raise Lost("the connection ended before the response did")
        self.raw += data
        self.last_byte_at = time.monotonic()

    def read_head(self, wait_s: float) -> None:
        """Status line and headers, waiting at most wait_s for each read (Quiet: nothing came in time)."""
        while b"\r\n\r\n" not in self.raw:
            if len(self.raw) > MAX_HEAD:
                raise Lost("the response's headers are too long")
            self._fill(wait_s)
        head, self.raw = self.raw.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[1].isdigit():
            raise Lost(f"not an HTTP response: {lines[0][:80]!r}")
        self.status = int(parts[1])
        for line in lines[1:]:
            name, _, value = line.partition(":")
            self.headers[name.strip().lower()] = value.strip()
        self.chunked = "chunked" in self.headers.get("transfer-encoding", "").lower()
        if not self.chunked and "content-length" in self.headers:
            self.length = int(self.headers["content-length"])
        self.done = self.length == 0

    def _decode(self) -> bool:
        """Move what is whole from raw to body; True if anything moved or the body ended."""
        if self.done:
            return True
        if not self.chunked:
            if not self.raw:
                return False
            take = self.raw if self.length is None else self.raw[:self.length]
            self.body += take
            self.raw = self.raw[len(take):]
            if self.length is not None:
                self.length -= len(take)
                self.done = self.length == 0
            return True
        moved = False
        while True:
            if self.crlf_due:
                if len(self.raw) < 2:
                    return moved
                self.raw, self.crlf_due = self.raw[2:], False
            if self.chunk_left == 0:
                line, sep, rest = self.raw.partition(b"\r\n")
                if not sep:
                    return moved
                size = int(line.split(b";")[0].strip() or b"0", 16)
                self.raw = rest
                if size == 0:
                    self.done = True  # trailers, if any, are not read: the connection closes
                    return True
                self.chunk_left = size
            if not self.raw:
                return moved
            take = self.raw[:self.chunk_left]
            self.body += take
            self.raw = self.raw[len(take):]
            self.chunk_left -= len(take)
            self.crlf_due = self.chunk_left == 0
            moved = True

    def _more(self, wait_s: float) -> None:
        """Decode more body, receiving if nothing whole is buffered (Quiet, Lost as _fill)."""
        if not self._decode():
            self._fill(wait_s)
            self._decode()
        if len(self.body) > MAX_EVENT:
            raise Lost("the upstream sent more than a response may hold")

    # ---- what callers read

    def next_event(self, wait_s: float) -> str | None:
        """The data of the next server-sent event (comments and empty events skipped), or None at the body's end.
        Quiet when nothing arrived within wait_s: call again, nothing is lost."""
        while True:
            end = self.body.find(b"\n\n")
            if end >= 0:
                event, self.body = self.body[:end], self.body[end + 2:]
                data = [line[5:].lstrip(b" ") for line in event.replace(b"\r\n", b"\n").split(b"\n")
                        if line.startswith(b"data:")]
                if data:
                    return b"\n".join(data).decode("utf-8")
                continue
            if self.done:
                return None
            self._more(wait_s)

    def read_body(self, wait_s: float) -> bytes:
        """The whole body (Quiet when nothing arrived within wait_s: call again, nothing is lost)."""
        while not self.done:
            self._more(wait_s)
        return self.body

    def take_body(self, wait_s: float) -> bytes:
        """What of the body has arrived so far (b"" at its end); Quiet when nothing arrived within wait_s."""
        if not self.body and not self.done:
            self._more(wait_s)
        out, self.body = self.body, b""
        return out

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


def send(host: str, port: int, method: str, path: str, body: bytes | None = None,
         headers: Mapping[str, str] | None = None, connect_timeout_s: float = 2.0) -> Upstream:
    """Connect (at most connect_timeout_s) and send one request; the response is read from what is returned."""
    try:
        sock = socket.create_connection((host, port), timeout=connect_timeout_s)
    except OSError as exc:
        raise Lost(f"cannot connect to {host}:{port}: {exc}") from None
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}:{port}", "Connection: close", "Accept: */*"]
    for name, value in (headers or {}).items():
        lines.append(f"{name}: {value}")
    if body is not None:
        lines.append(f"Content-Length: {len(body)}")
    try:
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        if body:
            sock.sendall(body)  # not joined to the head: a large body is not copied again
    except OSError as exc:
        sock.close()
        raise Lost(f"cannot send to {host}:{port}: {exc}") from None
    return Upstream(sock)


def call_json(host: str, port: int, path: str, payload: Any, timeout_s: float) -> tuple[int, Any, bytes]:
    """POST JSON (a payload already encoded is sent as it is) and read the whole JSON answer within timeout_s:
    (status, parsed or None, raw body)."""
    deadline = time.monotonic() + timeout_s
    data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    up = send(host, port, "POST", path, data, {"Content-Type": "application/json"}, connect_timeout_s=timeout_s)
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise Lost(f"{path} on {host}:{port} did not answer within {timeout_s:g} s")
            try:
                if not up.status:
                    up.read_head(left)
                raw = up.read_body(left)
                break
            except Quiet:
                continue
    finally:
        up.close()
    try:
        return up.status, json.loads(raw), raw
    except ValueError:
        return up.status, None, raw


def address(url: str) -> tuple[str, int]:
    """(host, port) of an http://HOST:PORT URL (the only kind this program is given)."""
    rest = url.removeprefix("http://").rstrip("/")
    host, sep, port = rest.rpartition(":")
    if not sep or not port.isdigit() or "/" in rest:
        raise ValueError(f"{url!r} is not http://HOST:PORT")
    return host.strip("[]"), int(port)
