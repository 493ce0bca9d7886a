"""A client's request taken within bounds: the HTTP server and handler base of the resuming layer (server.py) and of
SGLang's chat layer on the front (kimi_cluster/node/sglang_chat.py, which ships this module and request.py beside it).

Each connection is one client's and stays that client's trouble: its request line, headers and body must all come
within the server's `client_timeout_s` of the connection, however slowly they trickle (TimeoutError, answered 408);
the body by a Content-Length or chunks that must be numbers (400 naming the header otherwise), and up to the
server's `max_body` (413); every write to it must go through within the same timeout. One request a connection:
every answer is `Connection: close`. Standard library only.
"""

from __future__ import annotations

import socket
import string
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from .request import BadRequest, error_body

# What the front's Caddy buffers of a body (kimi_cluster/plan/front_tuning.py, request_buffers: 16MiB): a larger one
# is not replayed by Caddy either. tests/node/test_resume_input.py holds the two equal.
MAX_BODY = 16 * 1024 * 1024
CLIENT_TIMEOUT_S = 60.0  # a client's whole request must arrive, and each write to it go through, within this
HEX = frozenset(string.hexdigits.encode())


class BoundedServer(ThreadingHTTPServer):
    daemon_threads = True
    max_body: int = MAX_BODY
    client_timeout_s: float = CLIENT_TIMEOUT_S


class BoundedHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: BoundedServer

    def setup(self) -> None:
        super().setup()
        self.connection.settimeout(self.server.client_timeout_s)  # every read and write of this connection
        self.answered = False
        # The socket's timeout bounds each read, not the request: a client that sends a byte now and then would
        # hold this thread for as long as it likes. So the request line, the headers and the body must all have
        # come within client_timeout_s of the connection; at that deadline the read side is shut (a blocked read
        # returns) and the request is answered 408.
        self.read_late = False
        self.read_deadline = threading.Timer(self.server.client_timeout_s, self._stop_reading)
        self.read_deadline.daemon = True
        self.read_deadline.start()

    def finish(self) -> None:
        self.read_deadline.cancel()
        super().finish()

    def _stop_reading(self) -> None:
        self.read_late = True
        try:
            self.connection.shutdown(socket.SHUT_RD)
        except OSError:
            pass  # the client has gone already

    def log_message(self, fmt: str, *args: object) -> None:  # the callers log what they do; no line a request
        pass

    def whole(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        self.answered = True
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)

    def last_word(self, status: int, message: str, param: str | None = None) -> None:
        """A whole error answer if nothing was answered yet (a stream already going just ends)."""
        if self.answered:
            return
        try:
            self.whole(status, error_body(status, message, param))
        except OSError:
            pass

    def body(self) -> bytes:
        """The request's body, whole within the connection's read deadline (TimeoutError otherwise, a 408)."""
        try:
            body = self._read_body()
        except BadRequest:
            if self.read_late:  # the deadline shut the read side: the body ended because it was late
                raise TimeoutError from None
            raise
        finally:
            self.read_deadline.cancel()
        if self.read_late:
            raise TimeoutError
        return body

    def _read_body(self) -> bytes:
        """The request's body, by its length or its chunks, at most max_body bytes (BadRequest otherwise)."""
        limit = self.server.max_body
        too_large = BadRequest(413, f"the request body is larger than {limit} bytes")
        if "chunked" not in self.headers.get("Transfer-Encoding", "").lower():
            declared = (self.headers.get("Content-Length") or "0").strip()
            if not declared.isascii() or not declared.isdigit():
                raise BadRequest(400, "Content-Length must be a number of bytes", "Content-Length")
            if int(declared) > limit:
                raise too_large
            body = self.rfile.read(int(declared))
            if len(body) < int(declared):
                raise BadRequest(400, "the request body ended before its Content-Length", "Content-Length")
            return body
        parts: list[bytes] = []
        size_total = 0
        while True:
            line = self.rfile.readline(1024)
            size_text = line.split(b";")[0].strip()
            if not line.endswith(b"\n") or not size_text or len(size_text) > 16 or not set(size_text) <= HEX:
                raise BadRequest(400, "a chunk size must be a hexadecimal number", "Transfer-Encoding")
            size = int(size_text, 16)
            if size == 0:
                for _ in range(100):  # trailers, bounded
                    if self.rfile.readline(1024) in (b"\r\n", b"\n", b""):
                        break
                return b"".join(parts)
            size_total += size
            if size_total > limit:
                raise too_large
            chunk = self.rfile.read(size)
            if len(chunk) < size or self.rfile.readline(1024) not in (b"\r\n", b"\n"):
                raise BadRequest(400, "a chunk ended before its size", "Transfer-Encoding")
            parts.append(chunk)
