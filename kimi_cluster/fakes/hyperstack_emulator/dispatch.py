"""One request through the emulator, under its lock: recorded in the request log, then the pipeline's fault
injection points (RateLimit and ServerError before anything runs, LostCreateResponse after the endpoint ran), the
key check, the endpoint, and the API's error body for whatever went wrong."""

from __future__ import annotations

import fnmatch
import json
from typing import Any
from urllib.parse import parse_qs, urlsplit

from .admin import ADMIN_PREFIX, admin
from .faults import LostCreateResponse, RateLimit, ServerError, matches
from .lifecycle import sweep
from .request_log import RecordedRequest, RequestLog
from .routes import route
from .state import ApiError, Cloud, Drop


def handle(cloud: Cloud, log: RequestLog, admin_routes: bool, method: str, raw_path: str, headers: dict[str, str],
           raw_body: bytes) -> tuple[int, Any]:
    """(status, JSON payload) of one request; raises Drop when the connection is to close without an answer."""
    parts = urlsplit(raw_path)
    if admin_routes and parts.path.startswith(ADMIN_PREFIX):
        try:
            admin_body = json.loads(raw_body) if raw_body else None
        except ValueError:
            admin_body = None
        return admin(cloud, log, method, parts.path[len(ADMIN_PREFIX):], admin_body)
    path = parts.path[3:] if parts.path.startswith("/v1/") else parts.path
    query = parse_qs(parts.query)
    try:
        body = json.loads(raw_body) if raw_body else None
    except (ValueError, RecursionError):  # not JSON, not UTF-8, or nested deeper than the parser goes
        body = ...
    authorized = headers.get("api_key") in cloud.api_keys
    record = RecordedRequest(method, path, query, None if body is ... else body, authorized)
    with cloud.lock:
        log.append(record)
        sweep(cloud)
        faults = cloud.faults
        try:
            if faults.take(RateLimit, lambda f: matches(method, path, f.method, f.path)):
                raise ApiError(429, "rate_limited", "Too many requests: 500 per minute per IP")
            fault = faults.take(ServerError, lambda f: matches(method, path, f.method, f.path))
            if fault:
                record.status = fault.status
                return fault.status, {"message": "Internal Server Error"}
            if not parts.path.startswith("/v1/"):
                raise ApiError(404, "not_found", f"no route {parts.path}")
            if not authorized:
                raise ApiError(401, "unauthorized", "Invalid or missing API key (header api_key)")
            if body is ...:
                raise ApiError(400, "bad_request", "the body is not valid JSON")
            result = route(cloud, method, path, query, body)
            lost = faults.take(LostCreateResponse, lambda f: method == "POST" and fnmatch.fnmatch(path, f.path))
            if lost and lost.mode == "drop":
                raise Drop()
            if lost:
                raise ApiError(500, "server_error", "Internal Server Error")
            record.status = 200
            return 200, result
        except ApiError as err:
            record.status = err.status
            return err.status, {"status": False, "message": err.message, "error_reason": err.reason}
        except Drop:
            record.status = -1
            raise
        except Exception as exc:  # noqa: BLE001 - an emulator bug must surface as an answer, not a closed socket
            record.status = 500
            return 500, {"status": False, "message": f"emulator error: {exc!r}", "error_reason": "server_error"}
