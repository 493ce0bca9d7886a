"""The emulator's HTTP side: a stdlib threading server (on its host and any extra addresses, one port) whose handler
reads a request's body with the API's limits and answers what `handle` returns."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from .state import Drop

# A request body larger than any the API takes (a create with user_data is a few KB) is refused unread.
MAX_BODY_BYTES = 1 << 20
# How long a client may take to send its request line, headers or body before its connection is dropped.
SOCKET_TIMEOUT_S = 30.0

# (method, raw path, lower-cased headers, body) -> (status, JSON payload); raises Drop to close without answering.
Handle = Callable[[str, str, dict[str, str], bytes], tuple[int, Any]]


class _Handler(BaseHTTPRequestHandler):
    handle_request: Handle
    protocol_version = "HTTP/1.1"
    # Headers and body go out in separate writes; with Nagle on, each answer would wait for a delayed ACK.
    disable_nagle_algorithm = True

    def _serve(self) -> None:
        raw_length = self.headers.get("Content-Length") or "0"
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            return self._refuse(411, "length_required", "send the body with a Content-Length, not chunked")
        if not raw_length.isdigit():
            return self._refuse(400, "bad_request", "Content-Length is not a non-negative integer")
        length = int(raw_length)
        if length > MAX_BODY_BYTES:
            return self._refuse(413, "payload_too_large", f"the body may be at most {MAX_BODY_BYTES} bytes")
        try:
            raw = self.rfile.read(length) if length else b""
        except OSError:  # the socket timeout (TimeoutError) or a reset: drop this client, keep serving others
            self.close_connection = True
            return
        if len(raw) < length:  # the client closed before sending what it announced
            self.close_connection = True
            return
        headers = {k.lower(): v for k, v in self.headers.items()}
        try:
            status, payload = type(self).handle_request(self.command, self.path, headers, raw)
        except Drop:
            self.close_connection = True
            return
        self._answer(status, payload)

    def _refuse(self, status: int, reason: str, message: str) -> None:
        # The body may not have been read: the connection cannot be reused.
        self.close_connection = True
        self._answer(status, {"status": False, "message": message, "error_reason": reason})

    def _answer(self, status: int, payload: Any) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status, HTTPStatus(status).phrase if status in HTTPStatus._value2member_map_ else "")
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _serve

    def log_message(self, format: str, *args: Any) -> None:
        pass  # the request log lives in kimi_cluster/fakes/hyperstack_emulator/request_log.py


class Listeners:
    """The servers: one on `host` (port 0: any free one), one more on each extra host at the same port."""

    def __init__(self) -> None:
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._extra: list[ThreadingHTTPServer] = []

    @property
    def running(self) -> bool:
        return self._server is not None

    def start(self, host: str, port: int, extra_hosts: tuple[str, ...], handle: Handle,
              socket_timeout: float) -> int:
        """Start serving; the port it listens on."""
        handler = type("Handler", (_Handler,), {"handle_request": staticmethod(handle), "timeout": socket_timeout})
        self._server = ThreadingHTTPServer((host, port), handler)
        self._server.daemon_threads = True
        port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="hyperstack-emulator", daemon=True)
        self._thread.start()
        for extra_host in extra_hosts:  # the same state and port on another address of this machine
            extra = ThreadingHTTPServer((extra_host, port), handler)
            extra.daemon_threads = True
            self._extra.append(extra)
            threading.Thread(target=extra.serve_forever, kwargs={"poll_interval": 0.05},
                             name=f"hyperstack-emulator-{extra_host}", daemon=True).start()
        return port

    def stop(self) -> None:
        for extra in self._extra:
            extra.shutdown()
            extra.server_close()
        self._extra.clear()
        if self._server:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def wait(self) -> None:
        """Until the main server's thread ends; a Ctrl-C raises KeyboardInterrupt here."""
        assert self._thread is not None
        while self._thread.is_alive():
            self._thread.join(0.5)
