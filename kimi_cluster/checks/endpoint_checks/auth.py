"""The auth check: every path but /health refuses a missing or a wrong key, and the endpoint accepts its own.

Beyond /v1 it probes the routes the engines themselves leave open (vLLM's /invocations, /tokenize and /metrics sit
outside its guarded prefixes), the Anthropic route and a random path: behind the head's proxy, each answers 401.
"""

from __future__ import annotations

import secrets
from typing import Any

from kimi_cluster.checks.client import NO_KEY, TARGET_KEY, Api, RequestKey
from kimi_cluster.checks.results import CheckFailed
from kimi_cluster.checks.target import API_KEY_ENV


def check_auth(api: Api) -> tuple[str, dict[str, Any]]:
    if not api.target.api_key:
        raise CheckFailed(
            "no API key given to the verifier, so it cannot tell a protected endpoint from a "
            f"broken one; set {API_KEY_ENV} or pass --api-key-file"
        )
    wrong = RequestKey.given("wrong-" + secrets.token_hex(12))
    ping = {"model": api.target.model, "messages": [{"role": "user", "content": "ping"}], "max_tokens": 1}
    message = {"model": api.target.model, "messages": [{"role": "user", "content": "ping"}], "max_tokens": 1}
    routes = [
        ("GET", "/v1/models", None),
        ("POST", "/v1/chat/completions", ping),
        ("POST", "/v1/messages", message),
        ("POST", "/invocations", ping),
        ("POST", "/tokenize", {"model": api.target.model, "prompt": "ping"}),
        ("GET", "/metrics", None),
        ("GET", "/" + secrets.token_hex(6), None),
    ]
    probes = [(f"{method} {path} {label}", method, path, body, key, 401)
              for method, path, body in routes
              for label, key in (("without a key", NO_KEY), ("with a wrong key", wrong))]
    probes.append(("GET /v1/models with the key", "GET", "/v1/models", None, TARGET_KEY, 200))
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
            + ". An open route on a public address lets anyone spend the GPUs; put the authenticating proxy in front",
            metrics,
        )
    if problems:
        raise CheckFailed("the endpoint refuses its own key: " + "; ".join(problems), metrics)
    return (f"{len(routes)} routes (/invocations, /tokenize, /metrics and a random path included) answer 401 without "
            "a key and with a wrong key; 200 with the key"), metrics
