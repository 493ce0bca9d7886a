"""The verifier's HTTP client: requests against one target, every failure a CheckFailed saying what was asked."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal, Mapping, Sequence

import requests

from components.verification.prompts import SHORT_BUDGET
from components.verification.results import CheckFailed
from components.verification.target import API_KEY_ENV, Target
from components.verification.text import short


@dataclass(frozen=True)
class RequestKey:
    """Which key a request carries: the target's (the default), none, or a given one (a wrong key).

    The auth check sends all three; every other check sends the target's.
    """

    source: Literal["target", "none", "given"]
    value: str | None = field(default=None, repr=False)

    @staticmethod
    def given(value: str) -> RequestKey:
        return RequestKey("given", value)

    def resolve(self, target: Target) -> str | None:
        if self.source == "target":
            return target.api_key
        return self.value if self.source == "given" else None


TARGET_KEY = RequestKey("target")
NO_KEY = RequestKey("none")


@dataclass(frozen=True)
class ChatReply:
    """choices[0] of a chat completion: its message, why generation stopped, and the whole answer."""

    message: dict[str, Any]
    finish_reason: str | None
    data: dict[str, Any]

    @property
    def content(self) -> str:
        return (self.message.get("content") or "").strip()

    @property
    def usage(self) -> dict[str, Any]:
        return usage_of(self.data)


def usage_of(data: Mapping[str, Any]) -> dict[str, Any]:
    usage = data.get("usage")
    return usage if isinstance(usage, dict) else {}


def http_error(method: str, path: str, resp: requests.Response) -> str:
    reason = f"{method} {path} answered HTTP {resp.status_code}: {short(resp.text) or '(empty body)'}"
    if resp.status_code == 401:
        reason += f" (the key was refused: is {API_KEY_ENV} the cluster's api_key output?)"
    elif resp.status_code == 404 and "model" in resp.text.lower():
        reason += " (does --served-model-name match the model the verifier asks for?)"
    return reason


class Api:
    """Requests against one target; every failure becomes a CheckFailed with what was asked."""

    def __init__(self, target: Target, session: requests.Session) -> None:
        self.target = target
        self.session = session

    def _headers(self, key: RequestKey, extra: Mapping[str, str] | None) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        value = key.resolve(self.target)
        if value:
            headers["Authorization"] = f"Bearer {value}"
        headers.update(extra or {})
        return headers

    def request(
        self,
        method: str,
        path: str,
        body: Mapping[str, Any] | None = None,
        *,
        key: RequestKey = TARGET_KEY,
        headers: Mapping[str, str] | None = None,
        stream: bool = False,
    ) -> requests.Response:
        url = self.target.base_url + path
        timeout = self.target.timeout
        try:
            return self.session.request(
                method,
                url,
                data=json.dumps(body).encode() if body is not None else None,
                headers=self._headers(key, headers),
                timeout=(timeout, timeout),
                stream=stream,
                allow_redirects=False,
            )
        except requests.Timeout:
            raise CheckFailed(f"no answer from {method} {path} within the {timeout:g}s timeout")
        except requests.ConnectionError as exc:
            raise CheckFailed(f"could not connect for {method} {url}: {short(str(exc), 200)}")

    def json_ok(self, method: str, path: str, body: Mapping[str, Any] | None = None, **kw: Any) -> dict[str, Any]:
        resp = self.request(method, path, body, **kw)
        if resp.status_code != 200:
            raise CheckFailed(http_error(method, path, resp))
        try:
            data = resp.json()
        except ValueError:
            raise CheckFailed(f"{method} {path} answered 200 with a body that is not JSON: {short(resp.text)!r}")
        if not isinstance(data, dict):
            raise CheckFailed(f"{method} {path} answered 200 with JSON that is not an object: {short(resp.text)!r}")
        return data

    def chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        effort: str = "low",
        max_tokens: int = SHORT_BUDGET,
        tools: list[dict[str, Any]] | None = None,
    ) -> ChatReply:
        body: dict[str, Any] = {
            "model": self.target.model,
            "messages": list(messages),
            "reasoning_effort": effort,
            "max_tokens": max_tokens,
        }
        if tools:
            body["tools"] = tools
        data = self.json_ok("POST", "/v1/chat/completions", body)
        choices = data.get("choices")
        if not choices or not isinstance(choices[0], dict) or not isinstance(choices[0].get("message"), dict):
            raise CheckFailed(f"chat completion has no choices[0].message: {short(json.dumps(data))}")
        return ChatReply(dict(choices[0]["message"]), choices[0].get("finish_reason"), data)
