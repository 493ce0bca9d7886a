"""Post-deploy checks of a Kimi K3.1 Pro endpoint (OpenAI and Anthropic routes), as plain functions.
Each returns a CheckResult, never raises; used by scripts/verify_endpoint.py and the verification stack.
"""

from __future__ import annotations

import ast
import base64
import json
import operator
import re
import secrets
import struct
import time
import zlib
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence

import requests

DEFAULT_MODEL = "moonshotai/Kimi-K3.1-Pro"
# One request at "max" effort on a 3T-class model can think for minutes; 300 s bounds a hung
# endpoint without failing a healthy one.
DEFAULT_TIMEOUT_S = 300.0
API_KEY_ENV = "KIMI_API_KEY"

CHECK_NAMES: tuple[str, ...] = (
    "models",
    "auth",
    "chat",
    "effort",
    "preserved_thinking",
    "tool_calls",
    "image",
    "anthropic",
    "stream",
)

# SGLang names the thinking `reasoning_content`, vLLM names it `reasoning`; both accept either
# name on the way back in, so a client has to look for both.
REASONING_FIELDS: tuple[str, ...] = ("reasoning_content", "reasoning")


# --------------------------------------------------------------------------- results


@dataclass
class CheckResult:
    """The outcome of one check: `detail` is the reason when it failed."""

    name: str
    passed: bool
    latency_s: float
    detail: str
    metrics: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def line(self) -> str:
        status = "PASS" if self.passed else "FAIL"
        return f"{status}  {self.name:<19} {self.latency_s:7.2f}s  {self.detail}"


@dataclass(frozen=True)
class Target:
    """Where and what to check. `base_url` is the endpoint root; a trailing /v1 is accepted."""

    base_url: str
    model: str = DEFAULT_MODEL
    api_key: Optional[str] = field(default=None, repr=False)
    timeout: float = DEFAULT_TIMEOUT_S

    def __post_init__(self) -> None:
        object.__setattr__(self, "base_url", normalize_base_url(self.base_url))
        if not self.model:
            raise ValueError("model must name the served model id, e.g. " + DEFAULT_MODEL)
        if not self.timeout or self.timeout <= 0:
            raise ValueError(f"timeout must be a positive number of seconds, got {self.timeout!r}")


@dataclass
class VerificationOutcome:
    """Every result of one run plus which checks were required to pass."""

    endpoint_url: str
    model: str
    results: list[CheckResult]
    required: tuple[str, ...]

    @property
    def failed(self) -> list[CheckResult]:
        return [r for r in self.results if not r.passed]

    @property
    def failed_required(self) -> list[CheckResult]:
        return [r for r in self.failed if r.name in self.required]

    @property
    def all_passed(self) -> bool:
        return not self.failed

    @property
    def verified(self) -> bool:
        return not self.failed_required

    def report(self) -> list[dict[str, Any]]:
        return [dict(r.to_dict(), required=r.name in self.required) for r in self.results]

    def failure_summary(self) -> str:
        return "; ".join(f"{r.name}: {r.detail}" for r in self.failed_required)


class CheckFailed(Exception):
    """Raised inside a check with a specific reason; the runner turns it into a failed result."""

    def __init__(self, reason: str, metrics: Optional[dict[str, Any]] = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.metrics = metrics or {}


class VerificationFailed(Exception):
    """A required check failed; the message names each failed check and its reason."""

    def __init__(self, outcome: VerificationOutcome) -> None:
        self.outcome = outcome
        names = ", ".join(r.name for r in outcome.failed_required)
        super().__init__(
            f"verification of {outcome.endpoint_url} ({outcome.model}) failed; "
            f"required checks failed: {names}. {outcome.failure_summary()}"
        )


# --------------------------------------------------------------------------- helpers


def normalize_base_url(url: str) -> str:
    """Endpoint root without a trailing slash or /v1, so paths can always start with /v1."""
    if not url or not re.match(r"^https?://[^/\s]+", url.strip()):
        raise ValueError(f"base URL must look like http://HOST:PORT, got {url!r}")
    url = url.strip().rstrip("/")
    if url.endswith("/v1"):
        url = url[: -len("/v1")]
    return url


def select_checks(only: Optional[Iterable[str] | str]) -> tuple[str, ...]:
    """Check names in canonical order; `only` may be a comma list. Unknown names are an error."""
    if only is None:
        return CHECK_NAMES
    if isinstance(only, str):
        only = [part for part in only.split(",")]
    wanted = [name.strip() for name in only if name and name.strip()]
    if not wanted:
        return CHECK_NAMES
    unknown = sorted(set(wanted) - set(CHECK_NAMES))
    if unknown:
        raise ValueError(
            f"unknown check name(s) {unknown}; known checks: {', '.join(CHECK_NAMES)}"
        )
    return tuple(name for name in CHECK_NAMES if name in wanted)


def redact(text: str, secret: Optional[str]) -> str:
    """Hide the key if a server echoed it back into something we are about to print or store."""
    if secret and len(secret) >= 4 and secret in text:
        return text.replace(secret, "***")
    return text


def _redact_obj(obj: Any, secret: Optional[str]) -> Any:
    if not secret:
        return obj
    return json.loads(redact(json.dumps(obj), json.dumps(secret)[1:-1]))


def reasoning_of(message: Mapping[str, Any]) -> tuple[Optional[str], str]:
    """(field name, text) of the thinking in an assistant message, whichever engine sent it."""
    for name in REASONING_FIELDS:
        value = message.get(name)
        if isinstance(value, str) and value.strip():
            return name, value
    return None, ""


def assistant_turn(message: Mapping[str, Any]) -> dict[str, Any]:
    """The assistant message to send back: content, reasoning under the name it came in, tool calls.

    Kimi K3.1 Pro needs the whole turn back; rebuilding it from content alone loses the thinking.
    """
    turn: dict[str, Any] = {"role": "assistant", "content": message.get("content") or ""}
    for name in REASONING_FIELDS:
        if message.get(name):
            turn[name] = message[name]
    if message.get("tool_calls"):
        turn["tool_calls"] = message["tool_calls"]
    return turn


def make_split_png(
    left_rgb: tuple[int, int, int] = (255, 0, 0),
    right_rgb: tuple[int, int, int] = (0, 0, 255),
    width: int = 128,
    height: int = 128,
) -> bytes:
    """An 8-bit RGB PNG whose left half is one colour and right half another (stdlib only)."""
    left, right = bytes(left_rgb), bytes(right_rgb)
    half = width // 2
    row = b"\x00" + left * half + right * (width - half)  # leading 0 = filter type "None"
    raw = row * height

    def chunk(tag: bytes, data: bytes) -> bytes:
        body = tag + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(raw, 9))
        + chunk(b"IEND", b"")
    )


# --------------------------------------------------------------------------- local tools

_ARITH_BINOPS: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_ARITH_UNARY: dict[type, Callable[[Any], Any]] = {ast.USub: operator.neg, ast.UAdd: operator.pos}


def safe_arithmetic(expression: str) -> float | int:
    """Evaluate + - * / // % ** over numbers by walking the AST; anything else is refused.

    The expression comes from the model, so it must never reach eval().
    """
    if not isinstance(expression, str) or len(expression) > 200:
        raise ValueError("expression must be a string of at most 200 characters")

    def walk(node: ast.AST) -> float | int:
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _ARITH_BINOPS:
            left, right = walk(node.left), walk(node.right)
            # a model-chosen exponent like 9**9**9 would hang the verifier
            if isinstance(node.op, ast.Pow) and abs(right) > 64:
                raise ValueError("exponent too large")
            return _ARITH_BINOPS[type(node.op)](left, right)
        if isinstance(node, ast.UnaryOp) and type(node.op) in _ARITH_UNARY:
            return _ARITH_UNARY[type(node.op)](walk(node.operand))
        raise ValueError(f"unsupported element {type(node).__name__} in {expression!r}")

    return walk(ast.parse(expression.replace("×", "*").replace("^", "**"), mode="eval").body)


def tool_calculate(expression: str) -> dict[str, Any]:
    return {"result": safe_arithmetic(expression)}


WEATHER = {"Tokyo": "22C, clear", "London": "14C, rain", "Cairo": "35C, sunny"}


def tool_get_weather(city: str) -> dict[str, Any]:
    return {"city": city, "weather": WEATHER.get(city, "18C, partly cloudy")}


TOOL_IMPLS: dict[str, Callable[..., dict[str, Any]]] = {
    "calculate": tool_calculate,
    "get_weather": tool_get_weather,
}

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "calculate",
            "description": "Evaluate a basic arithmetic expression.",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string", "description": "e.g. '47*89'"}},
                "required": ["expression"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get current weather for a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    },
]

# --------------------------------------------------------------------------- prompts

WHO_PROMPT = "Who are you? One sentence."
BILL_PROMPT = (
    "Three friends split a bill. Ana pays twice what Ben pays, and Ben pays 3 more "
    "than Cara. The total is 43. How much does each pay?"
)
PRESERVED_HISTORY: list[dict[str, Any]] = [
    {"role": "user", "content": "Tell me three random numbers."},
    {
        "role": "assistant",
        "reasoning_content": "I will start by listing five numbers: 473, 921, 235, 215, 222, "
        "and I will tell you the first three.",
        "content": "473, 921, 235",
    },
    {"role": "user", "content": "What are the other two numbers you have in mind?"},
]
TOOL_TASK = (
    "What is 47 * 89? Also, what is the weather in Tokyo? "
    "Use your tools, then give me one combined answer."
)
IMAGE_PROMPT = "What do you see in this image? Name the colours and how they are arranged."
STREAM_PROMPT = "Count from 1 to 20, separated by spaces."
ANTHROPIC_PROMPT = "In one short sentence: what is the capital of France?"

MAX_TOOL_TURNS = 4
# The thinking counts against max_tokens, so budgets leave room for it before the answer.
SHORT_BUDGET = 2048
LONG_BUDGET = 8192


# --------------------------------------------------------------------------- HTTP

_USE_TARGET_KEY = object()


class _Api:
    """Requests against one target; every failure becomes a CheckFailed with what was asked."""

    def __init__(self, target: Target, session: requests.Session) -> None:
        self.target = target
        self.session = session

    def _headers(self, key: Any, extra: Optional[Mapping[str, str]]) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        key = self.target.api_key if key is _USE_TARGET_KEY else key
        if key:
            headers["Authorization"] = f"Bearer {key}"
        headers.update(extra or {})
        return headers

    def request(
        self,
        method: str,
        path: str,
        body: Optional[Mapping[str, Any]] = None,
        *,
        key: Any = _USE_TARGET_KEY,
        headers: Optional[Mapping[str, str]] = None,
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
            raise CheckFailed(f"could not connect for {method} {url}: {_short(str(exc), 200)}")

    def json_ok(self, method: str, path: str, body: Optional[Mapping[str, Any]] = None, **kw: Any) -> dict:
        resp = self.request(method, path, body, **kw)
        if resp.status_code != 200:
            raise CheckFailed(_http_error(method, path, resp))
        try:
            data = resp.json()
        except ValueError:
            raise CheckFailed(f"{method} {path} answered 200 with a body that is not JSON: {_short(resp.text)!r}")
        if not isinstance(data, dict):
            raise CheckFailed(f"{method} {path} answered 200 with JSON that is not an object: {_short(resp.text)!r}")
        return data

    def chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        effort: str = "low",
        max_tokens: int = SHORT_BUDGET,
        tools: Optional[list[dict[str, Any]]] = None,
    ) -> tuple[dict[str, Any], dict[str, Any]]:
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
            raise CheckFailed(f"chat completion has no choices[0].message: {_short(json.dumps(data))}")
        message = dict(choices[0]["message"])
        message["_finish_reason"] = choices[0].get("finish_reason")
        return message, data


def _short(text: str, limit: int = 240) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _http_error(method: str, path: str, resp: requests.Response) -> str:
    reason = f"{method} {path} answered HTTP {resp.status_code}: {_short(resp.text) or '(empty body)'}"
    if resp.status_code == 401:
        reason += f" (the key was refused: is {API_KEY_ENV} the cluster's api_key output?)"
    elif resp.status_code == 404 and "model" in resp.text.lower():
        reason += " (does --served-model-name match the model the verifier asks for?)"
    return reason


def _usage(data: Mapping[str, Any]) -> dict[str, Any]:
    usage = data.get("usage")
    return usage if isinstance(usage, dict) else {}


def _numbers(text: str) -> set[str]:
    return set(re.findall(r"\d+", text))


# --------------------------------------------------------------------------- checks
# Each body returns (detail, metrics) or raises CheckFailed; run_check times and wraps it.


def _check_models(api: _Api) -> tuple[str, dict[str, Any]]:
    data = api.json_ok("GET", "/v1/models")
    entries = data.get("data")
    if not isinstance(entries, list):
        raise CheckFailed(f"/v1/models has no data list: {_short(json.dumps(data))}")
    ids = [e.get("id") for e in entries if isinstance(e, dict)]
    expected = api.target.model
    metrics: dict[str, Any] = {"served_ids": ids}
    if expected not in ids:
        raise CheckFailed(
            f"/v1/models lists {ids}, not {expected!r}; "
            f"the server was started with another --served-model-name",
            metrics,
        )
    if len(ids) != 1:
        raise CheckFailed(f"/v1/models lists {len(ids)} models {ids}; expected exactly {expected!r}", metrics)
    entry = entries[ids.index(expected)]
    metrics["max_model_len"] = entry.get("max_model_len")
    metrics["owned_by"] = entry.get("owned_by")
    return (
        f"serves {expected} (owned_by {metrics['owned_by']}, max_model_len {metrics['max_model_len']})",
        metrics,
    )


_NO_KEY = None


def _check_auth(api: _Api) -> tuple[str, dict[str, Any]]:
    if not api.target.api_key:
        raise CheckFailed(
            "no API key given to the verifier, so it cannot tell a protected endpoint from a "
            f"broken one; set {API_KEY_ENV} or pass --api-key-file"
        )
    wrong = "wrong-" + secrets.token_hex(12)
    ping = {"model": api.target.model, "messages": [{"role": "user", "content": "ping"}], "max_tokens": 1}
    probes = [
        ("GET /v1/models without a key", "GET", "/v1/models", None, _NO_KEY, 401),
        ("GET /v1/models with a wrong key", "GET", "/v1/models", None, wrong, 401),
        ("POST /v1/chat/completions without a key", "POST", "/v1/chat/completions", ping, _NO_KEY, 401),
        ("GET /v1/models with the key", "GET", "/v1/models", None, _USE_TARGET_KEY, 200),
    ]
    statuses: dict[str, int] = {}
    problems: list[str] = []
    for label, method, path, body, key, expected in probes:
        status = api.request(method, path, body, key=key).status_code
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


def _check_chat(api: _Api) -> tuple[str, dict[str, Any]]:
    message, data = api.chat([{"role": "user", "content": WHO_PROMPT}], effort="low")
    content = (message.get("content") or "").strip()
    field_name, reasoning = reasoning_of(message)
    usage = _usage(data)
    metrics = {
        "reasoning_field": field_name,
        "completion_tokens": usage.get("completion_tokens"),
        "finish_reason": message.get("_finish_reason"),
    }
    problems = []
    if not content:
        hint = " (finish_reason=length: the thinking used the whole budget)" if message.get("_finish_reason") == "length" else ""
        problems.append("the answer has no content" + hint)
    if not reasoning:
        if "<think>" in content or "</think>" in content:
            problems.append(
                "the thinking arrived inline in content (saw a think tag) instead of a separate "
                "field: the server runs without --reasoning-parser kimi_k3"
            )
        else:
            problems.append(
                "the answer has no reasoning (neither reasoning_content nor reasoning is set); "
                "Kimi K3.1 Pro always thinks, so the reasoning parser is missing or broken"
            )
    if problems:
        raise CheckFailed("; ".join(problems), metrics)
    return f"answered {_short(content, 80)!r} with {len(reasoning)} chars of {field_name}", metrics


def _check_effort(api: _Api) -> tuple[str, dict[str, Any]]:
    metrics: dict[str, Any] = {}
    for effort in ("low", "max"):
        try:
            message, data = api.chat(
                [{"role": "user", "content": BILL_PROMPT}], effort=effort, max_tokens=LONG_BUDGET
            )
        except CheckFailed as exc:
            raise CheckFailed(f"reasoning_effort={effort}: {exc.reason}", metrics)
        if not (message.get("content") or "").strip() and not reasoning_of(message)[1]:
            raise CheckFailed(f"reasoning_effort={effort} answered with neither content nor reasoning", metrics)
        metrics[f"{effort}_completion_tokens"] = _usage(data).get("completion_tokens")
        metrics[f"{effort}_finish_reason"] = message.get("_finish_reason")
    return (
        f"low and max both answer; completion tokens low={metrics['low_completion_tokens']} "
        f"max={metrics['max_completion_tokens']}",
        metrics,
    )


def _check_preserved_thinking(api: _Api) -> tuple[str, dict[str, Any]]:
    message, _ = api.chat(PRESERVED_HISTORY, effort="max", max_tokens=LONG_BUDGET)
    content = (message.get("content") or "").strip()
    found = _numbers(content)
    metrics = {"answer": _short(content, 160)}
    missing = sorted({"215", "222"} - found)
    if missing:
        raise CheckFailed(
            f"the answer {_short(content, 120)!r} does not name {' and '.join(missing)}, which only the "
            "earlier turn's reasoning_content held: the server (or its chat template) drops reasoning "
            "from the history",
            metrics,
        )
    return "named 215 and 222 from the earlier turn's reasoning", metrics


def _check_tool_calls(api: _Api) -> tuple[str, dict[str, Any]]:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a helpful assistant with tools."},
        {"role": "user", "content": TOOL_TASK},
    ]
    called: list[str] = []
    metrics: dict[str, Any] = {"tool_calls": called}
    final = ""
    for turn in range(MAX_TOOL_TURNS):
        message, _ = api.chat(messages, effort="high", max_tokens=LONG_BUDGET, tools=TOOLS)
        calls = message.get("tool_calls") or []
        if not calls:
            final = (message.get("content") or "").strip()
            metrics["turns"] = turn + 1
            break
        messages.append(assistant_turn(message))
        for call in calls:
            function = call.get("function") if isinstance(call, dict) else None
            if not isinstance(function, dict):
                raise CheckFailed(f"turn {turn}: tool call without a function: {_short(json.dumps(call))}", metrics)
            name = function.get("name")
            if name not in TOOL_IMPLS:
                raise CheckFailed(f"turn {turn}: tool call names {name!r}, not one of {sorted(TOOL_IMPLS)}", metrics)
            raw = function.get("arguments")
            try:
                args = json.loads(raw) if isinstance(raw, str) else raw
            except ValueError:
                raise CheckFailed(
                    f"turn {turn}: arguments of {name} are not JSON: {_short(str(raw), 120)!r} "
                    "(is the server started with --tool-call-parser kimi_k3?)",
                    metrics,
                )
            if not isinstance(args, dict):
                raise CheckFailed(f"turn {turn}: arguments of {name} are not a JSON object: {_short(str(raw), 120)!r}", metrics)
            try:
                result = TOOL_IMPLS[name](**args)
            except Exception as exc:  # the model sees the error, as a real agent loop would show it
                result = {"error": f"{type(exc).__name__}: {exc}"}
            called.append(name)
            messages.append({
                "role": "tool",
                "tool_call_id": call.get("id") or name,
                "name": name,
                "content": json.dumps(result),
            })
    else:
        raise CheckFailed(f"the model still asked for tools after {MAX_TOOL_TURNS} turns", metrics)
    metrics["answer"] = _short(final, 200)
    not_called = sorted(set(TOOL_IMPLS) - set(called))
    if not_called:
        raise CheckFailed(f"the model never called {', '.join(not_called)}; answer: {_short(final, 120)!r}", metrics)
    problems = []
    if not re.search(r"4[,.'\s\u00a0\u202f]?183", final):
        problems.append("does not contain 4183 (47 * 89)")
    if not (re.search(r"22\s*°?\s*C", final, re.IGNORECASE) and re.search(r"\bclear\b", final, re.IGNORECASE)):
        problems.append("does not give Tokyo's weather (22C, clear)")
    if problems:
        raise CheckFailed(f"the final answer {_short(final, 160)!r} " + " and ".join(problems), metrics)
    return f"{len(called)} tool calls over {metrics['turns']} turns; answer has 4183 and 22C clear", metrics


def _check_image(api: _Api) -> tuple[str, dict[str, Any]]:
    b64 = base64.b64encode(make_split_png()).decode()
    message, _ = api.chat(
        [{
            "role": "user",
            "content": [
                {"type": "text", "text": IMAGE_PROMPT},
                {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{b64}"}},
            ],
        }],
        effort="low",
    )
    answer = (message.get("content") or "").strip()
    metrics = {"answer": _short(answer, 200)}
    missing = [c for c in ("red", "blue") if not re.search(rf"\b{c}\b", answer, re.IGNORECASE)]
    if missing:
        raise CheckFailed(
            f"the answer {_short(answer, 160)!r} does not name {' and '.join(missing)} "
            "for a left-red, right-blue image",
            metrics,
        )
    return f"named red and blue: {_short(answer, 80)!r}", metrics


def _check_anthropic(api: _Api) -> tuple[str, dict[str, Any]]:
    # SGLang and vLLM check only `Authorization: Bearer` (which is what Claude Code sends for
    # ANTHROPIC_AUTH_TOKEN); x-api-key rides along for gateways that want the Anthropic style.
    headers = {"anthropic-version": "2023-06-01"}
    if api.target.api_key:
        headers["x-api-key"] = api.target.api_key
    data = api.json_ok(
        "POST",
        "/v1/messages",
        {
            "model": api.target.model,
            "max_tokens": SHORT_BUDGET,
            "messages": [{"role": "user", "content": ANTHROPIC_PROMPT}],
        },
        headers=headers,
    )
    blocks = data.get("content")
    if not isinstance(blocks, list):
        raise CheckFailed(f"/v1/messages answer has no content list: {_short(json.dumps(data))}")
    types = [b.get("type") for b in blocks if isinstance(b, dict)]
    texts = [b.get("text", "") for b in blocks if isinstance(b, dict) and b.get("type") == "text"]
    metrics = {
        "block_types": types,
        "stop_reason": data.get("stop_reason"),
        "output_tokens": _usage(data).get("output_tokens"),
    }
    text = " ".join(t for t in texts if isinstance(t, str)).strip()
    if not text:
        raise CheckFailed(f"/v1/messages answered without a non-empty text block (blocks: {types})", metrics)
    return f"text block {_short(text, 80)!r}", metrics


def _check_stream(api: _Api) -> tuple[str, dict[str, Any]]:
    body = {
        "model": api.target.model,
        "messages": [{"role": "user", "content": STREAM_PROMPT}],
        "reasoning_effort": "low",
        "max_tokens": SHORT_BUDGET,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    start = time.monotonic()
    deadline = start + api.target.timeout
    resp = api.request("POST", "/v1/chat/completions", body, stream=True)
    with resp:
        if resp.status_code != 200:
            raise CheckFailed(_http_error("POST", "/v1/chat/completions (stream)", resp))
        metrics: dict[str, Any] = {"content_type": resp.headers.get("Content-Type")}
        first: Optional[float] = None
        chunks = token_chunks = 0
        content: list[str] = []
        usage: dict[str, Any] = {}
        done = False
        try:
            # real engines send chunked SSE, and urllib3 hands each chunk over as it arrives
            for raw in resp.iter_lines():
                if time.monotonic() > deadline:
                    raise CheckFailed(f"the stream was still running after {api.target.timeout:g}s", metrics)
                line = raw.decode("utf-8", "replace").strip() if raw else ""
                if not line.startswith("data:"):
                    continue
                payload = line[len("data:"):].strip()
                if payload == "[DONE]":
                    done = True
                    break
                try:
                    chunk = json.loads(payload)
                except ValueError:
                    raise CheckFailed(f"an SSE chunk is not JSON: {_short(payload, 120)!r}", metrics)
                chunks += 1
                if isinstance(chunk.get("usage"), dict):
                    usage = chunk["usage"]
                for choice in chunk.get("choices") or []:
                    delta = choice.get("delta") or {}
                    pieces = [delta.get(k) for k in ("content",) + REASONING_FIELDS]
                    if any(isinstance(p, str) and p for p in pieces):
                        token_chunks += 1
                        if first is None:
                            first = time.monotonic()
                    if isinstance(delta.get("content"), str):
                        content.append(delta["content"])
        except requests.RequestException as exc:
            raise CheckFailed(f"the stream broke after {chunks} chunks: {_short(str(exc), 160)}", metrics)
        end = time.monotonic()
    metrics["chunks"] = chunks
    if first is None:
        raise CheckFailed(f"the stream delivered {chunks} chunks but none carried content or reasoning", metrics)
    if not done:
        raise CheckFailed(f"the stream ended after {chunks} chunks without data: [DONE]", metrics)
    text = "".join(content).strip()
    if not text:
        raise CheckFailed("the stream carried reasoning but no answer content", metrics)
    tokens = usage.get("completion_tokens") or token_chunks
    generation_s = end - first
    metrics.update({
        "ttft_s": round(first - start, 4),
        "completion_tokens": tokens,
        "tokens_per_s": round(tokens / generation_s, 2) if generation_s > 0 else None,
    })
    return (
        f"{chunks} chunks, time to first token {metrics['ttft_s']:.2f}s, "
        f"{metrics['tokens_per_s']} tokens/s",
        metrics,
    )


_CHECK_BODIES: dict[str, Callable[[_Api], tuple[str, dict[str, Any]]]] = {
    "models": _check_models,
    "auth": _check_auth,
    "chat": _check_chat,
    "effort": _check_effort,
    "preserved_thinking": _check_preserved_thinking,
    "tool_calls": _check_tool_calls,
    "image": _check_image,
    "anthropic": _check_anthropic,
    "stream": _check_stream,
}
assert tuple(_CHECK_BODIES) == CHECK_NAMES


# --------------------------------------------------------------------------- runners


def run_check(name: str, target: Target, session: Optional[requests.Session] = None) -> CheckResult:
    """Run one check by name. A check that raises is a failed result, never an exception."""
    if name not in _CHECK_BODIES:
        raise ValueError(f"unknown check {name!r}; known checks: {', '.join(CHECK_NAMES)}")
    own_session = session is None
    session = session or requests.Session()
    start = time.monotonic()
    try:
        detail, metrics = _CHECK_BODIES[name](_Api(target, session))
        passed = True
    except CheckFailed as exc:
        passed, detail, metrics = False, exc.reason, exc.metrics
    except Exception as exc:  # a bug or an unexpected shape must not stop the other checks
        passed, detail, metrics = False, f"check raised {type(exc).__name__}: {_short(str(exc), 200)}", {}
    finally:
        if own_session:
            session.close()
    latency = round(time.monotonic() - start, 4)
    return CheckResult(
        name=name,
        passed=passed,
        latency_s=latency,
        detail=redact(detail, target.api_key),
        metrics=_redact_obj(metrics, target.api_key),
    )


def run_checks(
    target: Target,
    only: Optional[Iterable[str] | str] = None,
    session: Optional[requests.Session] = None,
    on_result: Optional[Callable[[CheckResult], None]] = None,
) -> list[CheckResult]:
    """Run the selected checks in canonical order; `on_result` sees each result as it lands."""
    names = select_checks(only)
    own_session = session is None
    session = session or requests.Session()
    results = []
    try:
        for name in names:
            result = run_check(name, target, session)
            results.append(result)
            if on_result:
                on_result(result)
    finally:
        if own_session:
            session.close()
    return results


def verify(
    endpoint_url: str,
    model: str,
    api_key: Optional[str],
    *,
    only: Optional[Iterable[str] | str] = None,
    required: Optional[Iterable[str] | str] = None,
    timeout: float = DEFAULT_TIMEOUT_S,
    session: Optional[requests.Session] = None,
    on_result: Optional[Callable[[CheckResult], None]] = None,
) -> VerificationOutcome:
    """Run the checks and say which required ones failed. Required defaults to every check run.

    A required check that is not selected by `only` is an error: it could never pass.
    """
    target = Target(endpoint_url, model, api_key, timeout)
    selected = select_checks(only)
    needed = selected if required is None else select_checks(required)
    not_run = [name for name in needed if name not in selected]
    if not_run:
        raise ValueError(f"required checks {not_run} are not among the checks to run {list(selected)}")
    results = run_checks(target, selected, session=session, on_result=on_result)
    return VerificationOutcome(target.base_url, model, results, tuple(needed))


# --------------------------------------------------------------------------- the verification stack's run

# Inputs of the verification stack's resource; the first four re-run the checks with a fresh
# resource when they change, the rest re-run them in place.
STACK_REPLACE_KEYS: tuple[str, ...] = ("endpoint_url", "served_model_name", "model_revision", "run_id")
STACK_UPDATE_KEYS: tuple[str, ...] = ("only", "required_checks", "timeout_seconds")


def run_stack_checks(
    endpoint_url: str,
    served_model_name: str,
    api_key: Optional[str],
    *,
    model_revision: Optional[str] = "",
    run_id: Optional[str] = "",
    only: Optional[Iterable[str] | str] = None,
    required_checks: Optional[Iterable[str] | str] = None,
    timeout_seconds: float = DEFAULT_TIMEOUT_S,
    session: Optional[requests.Session] = None,
) -> dict[str, Any]:
    """What the verification stack records, without Pulumi: the outputs when every required check
    passed, or VerificationFailed naming each failed required check and its reason.

    The key is used for the requests only; nothing returned contains it.
    """
    outcome = verify(
        endpoint_url,
        served_model_name,
        api_key,
        only=only,
        required=required_checks,
        timeout=float(timeout_seconds or DEFAULT_TIMEOUT_S),
        session=session,
    )
    if not outcome.verified:
        raise VerificationFailed(outcome)
    selected = [r.name for r in outcome.results]
    return {
        "endpoint_url": endpoint_url,
        "served_model_name": served_model_name,
        "model_revision": model_revision or "",
        "run_id": run_id or "",
        "only": selected,
        "required_checks": list(outcome.required),
        "timeout_seconds": float(timeout_seconds or DEFAULT_TIMEOUT_S),
        "report": outcome.report(),
        "verified": outcome.verified,
        "all_passed": outcome.all_passed,
        "failed_checks": [r.name for r in outcome.failed],
        "verified_endpoint_url": endpoint_url if outcome.verified else None,
        "checked_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
