"""Requests this layer sends as they are to a replica's own chat endpoint: one not streamed (`whole`), and a stream
that cannot be resumed exactly (`passed_through`).

A replica's HTTP answer, whatever its status, is that request's answer, and the client gets it as the replica sent
it: a 500 for an image vLLM could not fetch is the client's own trouble, not the replica's, so it is neither taken
out of the pool nor sent the request again (one client's bad requests would otherwise take every replica out for
every client). A replica is lost only when its connection fails or resets, ends before the answer does, or stays
silent past `silence_s` while its health check fails; then a request not yet answered goes whole to the twin
(nothing was answered, so nothing is answered twice), and a pass-through stream already going ends with an error
event naming the cause. The health check alone decides when a replica serves again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from . import messages, wire
from .generation import Limits, Unavailable, read_while_alive
from .pool import Pool, Replica, log
from .request import error_body

MESSAGES_PATH = "/v1/messages"


class Client(Protocol):
    """What answers the client (server.py): a whole answer, or a stream of events and comments."""

    def whole(self, status: int, body: bytes, content_type: str = "application/json") -> None: ...
    def start_stream(self) -> None: ...
    def write(self, data: bytes) -> None: ...
    def end(self) -> None: ...


def send_to_replica(pool: Pool, limits: Limits, path: str, raw: bytes, stream: bool,
                    ) -> tuple[Replica, wire.Upstream]:
    """Send the body to a healthy replica's chat endpoint and read its status line and headers, whatever the status;
    a replica that cannot be reached, resets, or stays silent while its health check fails is marked down and the
    next one tried."""
    tried: tuple[Replica, ...] = ()
    while True:
        replica = pool.pick(wait_s=limits.pick_s)
        if replica is None:
            raise Unavailable("no replica is healthy" + (f" (tried {', '.join(r.url for r in tried)})"
                                                         if tried else ""))
        tried = (*tried, replica)
        try:
            up = wire.send(replica.host, replica.port, "POST", path, raw,
                           {"Content-Type": "application/json",
                            "Accept": "text/event-stream" if stream else "application/json"}, limits.connect_s)
            read_while_alive(pool, replica, up, up.read_head, limits)
            return replica, up
        except wire.Lost as exc:
            pool.release(replica)
            pool.mark_lost(replica, str(exc))
            if len(tried) > limits.resumes:
                raise Unavailable(f"lost {len(tried)} replicas: {exc}") from None


def whole(pool: Pool, limits: Limits, path: str, raw: bytes, client: Client) -> None:
    """A request that is not streamed: the replica's answer, or the next replica's if that one is lost before its
    answer is whole."""
    losses = 0
    while True:
        try:
            if losses > limits.resumes:
                raise Unavailable(f"lost {losses} replicas during this request")
            replica, up = send_to_replica(pool, limits, path, raw, stream=False)
        except Unavailable as exc:
            return client.whole(503, error_body(503, str(exc)))
        try:
            answer = read_while_alive(pool, replica, up, up.read_body, limits)
            return client.whole(up.status, answer, up.headers.get("content-type", "application/json"))
        except wire.Lost as exc:
            losses += 1
            pool.mark_lost(replica, str(exc))
            log(f"a request that is not streamed lost {replica.url} ({exc}); sending it whole to another replica")
        finally:
            up.close()
            pool.release(replica)


def passed_through(pool: Pool, limits: Limits, path: str, raw: bytes, client: Client) -> None:
    """A stream that is not resumed: relayed as the replica sends it, a read at a time, so a client that reads
    slowly holds the replica's connection back rather than filling this layer's memory."""
    try:
        replica, up = send_to_replica(pool, limits, path, raw, stream=True)
    except Unavailable as exc:
        return client.whole(503, error_body(503, str(exc)))

    def read(how: Callable[[float], Any]) -> Any:
        return read_while_alive(pool, replica, up, how, limits)

    try:
        if up.status != 200:
            return client.whole(up.status, read(up.read_body), up.headers.get("content-type", "application/json"))
        client.start_stream()
        while True:
            data = read(up.take_body)
            if not data:
                break
            client.write(data)
        client.end()
    except wire.Lost as exc:
        pool.mark_lost(replica, str(exc))
        message = f"the replica serving this stream was lost ({exc}); this request cannot be resumed exactly"
        end_with(client, messages.error_event(message, "overloaded_error") if path == MESSAGES_PATH
                 else b"data: " + error_body(503, message) + b"\n\n")
    finally:
        up.close()
        pool.release(replica)


def end_with(client: Client, frame: bytes) -> None:
    """An error event, as the engine streams one, then the end: the client's SDK raises it with its message."""
    try:
        client.write(frame)
        client.end()
    except OSError:
        pass
