"""The verifier's HTTP client: requests against one target, every failure a CheckFailed saying what was asked."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

import requests

from kimi_cluster.checks.deadline import Deadline
from kimi_cluster.checks.prompts import SHORT_BUDGET
from kimi_cluster.checks.results import CheckFailed
from kimi_cluster.checks.target import API_KEY_ENV, Target
from kimi_cluster.checks.text import redact, redact_obj, short

# The largest answer the verifier reads. A chat completion at the long budget (8192 tokens) is
# tens of kB, and a stream of it, one SSE event of a few hundred bytes per token, a few MB; a
# server that sends more is broken, and reading it whole would hold it all in memory.
MAX_ANSWER_BYTES = 16 * 1024 * 1024
_READ_CHUNK = 64 * 1024
# the stream check measures time to first token, so it takes each piece as soon as it arrives
_STREAM_CHUNK = 512


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


@dataclass(frozen=True)
class Answer:
    """A whole HTTP answer, read within the check's deadline and size cap, with the key already
    hidden in its text and in its parsed JSON."""

    status_code: int
    headers: Mapping[str, str]
    text: str
    _json: Any = field(default=None, repr=False)
    _json_error: str | None = field(default=None, repr=False)

    def json(self) -> Any:
        if self._json_error is not None:
            raise ValueError(self._json_error)
        return self._json


def http_error(method: str, path: str, answer: Answer) -> str:
    reason = f"{method} {path} answered HTTP {answer.status_code}: {short(answer.text) or '(empty body)'}"
    if answer.status_code == 401:
        reason += f" (the key was refused: is {API_KEY_ENV} the cluster's api_key output?)"
    elif answer.status_code == 404 and "model" in answer.text.lower():
        reason += " (does --served-model-name match the model the verifier asks for?)"
    return reason


def tls_reason(exc: BaseException) -> str:
    """Why a TLS handshake failed, in the words a reader can act on."""
    text = str(exc)
    if "unable to get local issuer certificate" in text or "self-signed certificate" in text or \
            "self signed certificate" in text:
        return ("the server's certificate does not chain to the CA the verifier was given (the cluster's "
                f"ca_certificate output): {short(text, 200)}")
    if "IP address mismatch" in text or "Hostname mismatch" in text or "doesn't match" in text:
        return f"the certificate is not valid for the endpoint's address: {short(text, 200)}"
    if "certificate has expired" in text:
        return f"the server's certificate has expired: {short(text, 200)}"
    if "wrong version number" in text or "record layer failure" in text:
        return f"the endpoint does not speak TLS on that port: {short(text, 200)}"
    return short(text, 240)


class Api:
    """Requests against one target within one check's Deadline; every failure becomes a
    CheckFailed with what was asked."""

    def __init__(self, target: Target, session: requests.Session, deadline: Deadline) -> None:
        self.target = target
        self.session = session
        self.deadline = deadline

    def _headers(self, key: RequestKey, extra: Mapping[str, str] | None) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        value = key.resolve(self.target)
        if value:
            headers["Authorization"] = f"Bearer {value}"
        headers.update(extra or {})
        return headers

    def _too_late(self, method: str, path: str) -> CheckFailed:
        return CheckFailed(
            f"no complete answer from {method} {path} within the {self.target.timeout:g}s timeout of the check"
        )

    # Raised `from None`: the cause (requests' own error) may quote the key, in a header it refused.
    def _failure(self, method: str, path: str, what: str, exc: BaseException) -> CheckFailed:
        if self.deadline.expired or isinstance(exc, requests.Timeout):
            return self._too_late(method, path)
        return CheckFailed(f"{what}: {short(redact(str(exc), self.target.api_key), 200)}")

    def request(
        self,
        method: str,
        path: str,
        body: Mapping[str, Any] | None = None,
        *,
        key: RequestKey = TARGET_KEY,
        headers: Mapping[str, str] | None = None,
    ) -> requests.Response:
        """The response with its headers read and its body not yet; close it (or use `with`)."""
        url = self.target.base_url + path
        remaining = self.deadline.remaining()
        if remaining <= 0:
            raise self._too_late(method, path)
        try:
            resp = self.session.request(
                method,
                url,
                data=json.dumps(body).encode() if body is not None else None,
                headers=self._headers(key, headers),
                timeout=(remaining, remaining),
                stream=True,
                allow_redirects=False,
                verify=self.target.verify,
            )
        except requests.exceptions.SSLError as exc:
            raise CheckFailed(f"TLS to {url} failed: {tls_reason(exc)}") from None
        except requests.ConnectionError as exc:
            raise self._failure(method, path, f"could not connect for {method} {url}", exc) from None
        except requests.RequestException as exc:
            raise self._failure(method, path, f"{method} {url} failed", exc) from None
        if self.deadline.cut_off:
            resp.close()
            raise self._too_late(method, path)
        return resp

    def _read(self, method: str, path: str, resp: requests.Response) -> bytes:
        declared = resp.headers.get("Content-Length", "")
        if declared.isdigit() and int(declared) > MAX_ANSWER_BYTES:
            raise CheckFailed(f"{method} {path} announced {int(declared)} bytes; {_cap()}")
        body = bytearray()
        try:
            for piece in resp.iter_content(_READ_CHUNK):
                body += piece
                if len(body) > MAX_ANSWER_BYTES:
                    raise CheckFailed(f"{method} {path} answered more than {MAX_ANSWER_BYTES} bytes; {_cap()}")
        except requests.RequestException as exc:
            raise self._failure(method, path, f"{method} {path} broke off its answer", exc) from None
        if self.deadline.cut_off:
            raise self._too_late(method, path)
        return bytes(body)

    def answer(self, method: str, path: str, body: Mapping[str, Any] | None = None, **kw: Any) -> Answer:
        """The whole answer; `kw` as for `request`."""
        with self.request(method, path, body, **kw) as resp:
            raw = self._read(method, path, resp)
            status, answer_headers = resp.status_code, dict(resp.headers)
        secret = self.target.api_key
        text = raw.decode("utf-8", "replace")
        try:
            parsed, error = redact_obj(json.loads(text), secret), None
        except ValueError as exc:
            parsed, error = None, str(exc)
        return Answer(status, redact_obj(answer_headers, secret), redact(text, secret), parsed, error)

    def json_ok(self, method: str, path: str, body: Mapping[str, Any] | None = None, **kw: Any) -> dict[str, Any]:
        answer = self.answer(method, path, body, **kw)
        if answer.status_code != 200:
            raise CheckFailed(http_error(method, path, answer))
        try:
            data = answer.json()
        except ValueError:
            raise CheckFailed(
                f"{method} {path} answered 200 with a body that is not JSON: {short(answer.text)!r}") from None
        if not isinstance(data, dict):
            raise CheckFailed(f"{method} {path} answered 200 with JSON that is not an object: {short(answer.text)!r}")
        return data

    @contextmanager
    def stream(self, method: str, path: str, body: Mapping[str, Any], label: str) -> Iterator[Stream]:
        """A 200 answer whose body is read line by line as it arrives; any other status is a
        CheckFailed naming `label`."""
        with self.request(method, path, body) as resp:
            if resp.status_code != 200:
                raw = self._read(method, path, resp)
                text = redact(raw.decode("utf-8", "replace"), self.target.api_key)
                raise CheckFailed(http_error(method, label, Answer(resp.status_code, {}, text)))
            yield Stream(self, method, path, resp)

    def chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        effort: str = "low",
        max_tokens: int = SHORT_BUDGET,
        tools: Sequence[Mapping[str, Any]] | None = None,
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


class Stream:
    """The body of a streamed answer, line by line, within the deadline and the size cap, key hidden."""

    def __init__(self, api: Api, method: str, path: str, resp: requests.Response) -> None:
        self.api, self.method, self.path, self.resp = api, method, path, resp
        self.headers: Mapping[str, str] = redact_obj(dict(resp.headers), api.target.api_key)

    def lines(self) -> Iterator[str]:
        secret = self.api.target.api_key
        received = 0
        pending = b""
        try:
            for piece in self.resp.iter_content(_STREAM_CHUNK):
                received += len(piece)
                if received > MAX_ANSWER_BYTES:
                    raise CheckFailed(
                        f"the stream of {self.method} {self.path} ran past {MAX_ANSWER_BYTES} bytes; {_cap()}")
                *lines, pending = (pending + piece).split(b"\n")
                for line in lines:
                    yield redact(line.decode("utf-8", "replace").strip(), secret)
        except requests.RequestException as exc:
            raise self.api._failure(self.method, self.path, "the stream broke", exc) from None
        if self.api.deadline.cut_off:
            raise self.api._too_late(self.method, self.path)
        if pending:
            yield redact(pending.decode("utf-8", "replace").strip(), secret)


def _cap() -> str:
    return f"the verifier reads at most {MAX_ANSWER_BYTES // (1024 * 1024)} MiB of an answer"
