"""The auth check: the endpoint refuses a missing or wrong key and accepts its own."""

from __future__ import annotations

import secrets
from typing import Any

from components.verification.client import NO_KEY, TARGET_KEY, Api, RequestKey
from components.verification.results import CheckFailed
from components.verification.target import API_KEY_ENV


def check_auth(api: Api) -> tuple[str, dict[str, Any]]:
    if not api.target.api_key:
        raise CheckFailed(
            "no API key given to the verifier, so it cannot tell a protected endpoint from a "
            f"broken one; set {API_KEY_ENV} or pass --api-key-file"
        )
    wrong = RequestKey.given("wrong-" + secrets.token_hex(12))
    ping = {"model": api.target.model, "messages": [{"role": "user", "content": "ping"}], "max_tokens": 1}
    probes = [
        ("GET /v1/models without a key", "GET", "/v1/models", None, NO_KEY, 401),
        ("GET /v1/models with a wrong key", "GET", "/v1/models", None, wrong, 401),
        ("POST /v1/chat/completions without a key", "POST", "/v1/chat/completions", ping, NO_KEY, 401),
        ("GET /v1/models with the key", "GET", "/v1/models", None, TARGET_KEY, 200),
    ]
    statuses: dict[str, int] = {}
    problems: list[str] = []
    for label, method, path, body, key, expected in probes:
        status = api.answer(method, path, body, key=key).status_code
        statuses[label] = status
        if status != expected:
            problems.append(f"{label} answered HTTP {status} (expected {expected})")
    metrics = {"statuses": statuses}
    if any("without a key" in p or "wrong key" in p for p in problems):
        raise CheckFailed(
            "the endpoint is not protected: " + "; ".join(problems)
            + ". An open endpoint on a public address lets anyone spend the GPUs; start the server with --api-key",
            metrics,
        )
    if problems:
        raise CheckFailed("the endpoint refuses its own key: " + "; ".join(problems), metrics)
    return "401 without a key and with a wrong key; 200 with the key", metrics
