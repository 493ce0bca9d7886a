"""The caretaker's keys: idleStopMinutes, budgetUsd, caretakerApiUrl, caretakerTiming and the secret caretakerApiKey.

Both guards are off by default; either one, once set, starts the caretaker (kimi_cluster/plan/caretaker.py) on the VM
that
holds the endpoint, with a Hyperstack API key of its own. Each function here takes one raw value and returns it
normalized, or raises ValueError with the message the settings error shows for its key; `problems` holds the rules
across keys and `warnings` what is allowed but worth saying. Whether a budget is already spent needs the API, so
that check is the deploying side's (kimi_cluster/node/caretaker_spend.py), before anything is registered.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from kimi_cluster.settings.errors import shown
from kimi_cluster.settings.keys import NAMESPACE

IDLE_MIN_MINUTES = 15  # the floor: shorter stops a cluster between two ordinary pauses
IDLE_MAX_MINUTES = 7 * 24 * 60
BUDGET_MAX_USD = 10_000_000.0  # far beyond any one stack's spend; bounds the arithmetic and the error's text
DEFAULT_API_URL = "https://infrahub-api.nexgencloud.com/v1"  # kimi_cluster/hyperstack_api/api.py DEFAULT_API_URL
API_KEY = "caretakerApiKey"


@dataclass(frozen=True)
class CaretakerTiming:
    """How often the caretaker looks (`pollSeconds`), and how long its minute is (`minuteSeconds`, 60 on a real
    stack: idleStopMinutes counts these; the sandbox shortens it as it shortens every wait)."""

    poll_seconds: float = 60.0
    minute_seconds: float = 60.0


_TIMING_FIELDS = {"pollSeconds": ("poll_seconds", 1.0, 3600.0), "minuteSeconds": ("minute_seconds", 0.1, 60.0)}


def idle_minutes(v: Any) -> Any:
    """Whole minutes, 15 to 7 days; a numeric string (pulumi config's form) is read as its number."""
    if v is None:
        return v
    if isinstance(v, bool) or not isinstance(v, (int, str)) or (isinstance(v, str) and not v.strip().isdigit()):
        raise ValueError(f"{shown(v)} is not a whole number of minutes, e.g. 60")
    minutes = int(v)
    if not IDLE_MIN_MINUTES <= minutes <= IDLE_MAX_MINUTES:
        raise ValueError(f"{minutes} minutes is outside {IDLE_MIN_MINUTES} to {IDLE_MAX_MINUTES} (7 days): shorter "
                         "stops a cluster between two ordinary pauses, longer is no idle stop at all")
    return minutes


def budget(v: Any) -> Any:
    """A positive, finite number of US dollars; NaN, infinity, a bool and text that is no number are refused."""
    if v is None:
        return v
    if isinstance(v, bool):
        raise ValueError(f"{shown(v)} is not a number of US dollars, e.g. 500")
    try:
        usd = float(v.strip()) if isinstance(v, str) else float(v)
    except OverflowError:  # an integer past the float range (YAML reads 1e400 written out as an int)
        raise ValueError(f"{shown(v)} US dollars is more than {BUDGET_MAX_USD:,.0f}: no limit at all") from None
    except (TypeError, ValueError):
        raise ValueError(f"{shown(v)} is not a number of US dollars, e.g. 500") from None
    if math.isnan(usd) or math.isinf(usd):
        raise ValueError(f"{shown(v)} is not a finite number of US dollars, e.g. 500")
    if usd <= 0:
        raise ValueError(f"{usd:g} is not a budget: it must be more than 0 US dollars")
    if usd > BUDGET_MAX_USD:
        raise ValueError(f"{usd:g} US dollars is more than {BUDGET_MAX_USD:,.0f}: no limit at all")
    return usd


def timing(v: Any) -> dict[str, float]:
    """`{"pollSeconds": 60, "minuteSeconds": 60}`, either left out; a JSON string (pulumi config's form) too."""
    from kimi_cluster.settings.rules import json_text_object

    if v is None or v == "":
        return {}
    expected = f"{shown(v)} is not a JSON object such as '{{\"pollSeconds\": 60}}'"
    v = json_text_object(v, expected)  # nested past Python's stack too
    if not isinstance(v, dict):
        raise ValueError(expected)
    out: dict[str, float] = {}
    for name, value in v.items():
        if name not in _TIMING_FIELDS:
            raise ValueError(f"{shown(name)} is not a caretaker timing; known: {', '.join(_TIMING_FIELDS)}")
        _, low, high = _TIMING_FIELDS[name]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
            raise ValueError(f"{name} {shown(value)} must be a number of seconds from {low:g} to {high:g}")
        out[name] = float(value)
    return out


URL_MAX = 2048  # far beyond any API base URL; bounds the checks and the error's text
HOST_MAX, LABEL_MAX = 253, 63  # RFC 1035: a longer name never resolves, so every delete would fail


def api_url(v: str) -> str:
    """The API as the caretaker dials it from its VM: a URL ending in /v1 (Hyperstack's base, or a relay's), whose
    host could resolve; https, or plain http to loopback or a private address only (its key travels in a header)."""
    from kimi_cluster.settings.networks import on_private_path
    from kimi_cluster.settings.rules import HF_ENDPOINT_RE, url_problem

    if len(v) > URL_MAX:
        raise ValueError(f"{shown(v)} is {len(v):,} characters, longer than any API URL ({URL_MAX:,} at most)")
    problem = url_problem(v, API_KEY)
    if problem:
        raise ValueError(problem)
    match = HF_ENDPOINT_RE.fullmatch(v)
    assert match is not None  # url_problem found none
    host = match["host"]
    if not host.startswith("[") and (len(host) > HOST_MAX or any(len(label) > LABEL_MAX for label in host.split("."))
                                     or ".." in host):
        raise ValueError(f"{shown(v)} has a host name no DNS server resolves (at most {HOST_MAX} characters, "
                         f"{LABEL_MAX} per label): every delete would fail while the cluster bills")
    if not (match["path"] or "").rstrip("/").endswith("/v1"):
        raise ValueError(f"{shown(v)} does not end in /v1, as Hyperstack's API does ({DEFAULT_API_URL}): every "
                         "call would miss it")
    if match["scheme"] == "http" and not on_private_path(host):
        raise ValueError(f"{shown(v)} is plain http:// to a host outside loopback and private networks: the "
                         f"caretaker's key would cross the internet in clear; use https://")
    return v.rstrip("/")


def key_problem(text: Any) -> str | None:
    """Why `text` cannot be caretakerApiKey, or None; never quotes it. The node keeps its first line, stripped, so a
    blank key, a second line or a control character would leave the guard without its key, or with the wrong one."""
    if not isinstance(text, str):
        return "is not text (the value is not shown): set the key itself, with pulumi config set --secret"
    if not text.strip():
        return "is blank: the caretaker would run with no key and never stop anything"
    if not re.fullmatch(r"[!-~]{8,512}", text.strip()):
        return ("is not one line of 8 to 512 printable characters without spaces (the value is not shown): the node "
                "would keep a part of it, and the guard would never reach the API")
    return None


def test_clock(api_url_value: str) -> bool:
    """Whether the caretaker's API is an emulator beside the stack, where a shortened minute is safe: plain http to
    loopback or a private address. Hyperstack's own API is https, so a real stack's caretaker keeps 60 s minutes."""
    from kimi_cluster.settings.networks import on_private_path
    from kimi_cluster.settings.rules import HF_ENDPOINT_RE

    match = HF_ENDPOINT_RE.fullmatch(api_url_value)
    return bool(match and match["scheme"] == "http" and on_private_path(match["host"]))


def timing_of(raw: dict[str, float]) -> CaretakerTiming:
    return CaretakerTiming(**{_TIMING_FIELDS[k][0]: v for k, v in raw.items()})


RATE_MIN_USD = 0.01  # an hour of the GPU VMs below a cent is no rate: the budget's fallback would never grow


def problems(idle: int | None, budget_usd: float | None, key_set: bool, *, api_url_value: str = DEFAULT_API_URL,
             minute_seconds: float = 60.0, usd_per_hour: float | None = None,
             flavor: str = "") -> list[str]:
    """Rules across keys: a guard needs the caretaker's own key; a shortened minute needs an emulator; a budget needs
    the rate it counts on with while the billing history does not answer."""
    out = []
    if (idle is not None or budget_usd is not None) and not key_set:
        given = " and ".join(f"{NAMESPACE}:{k}" for k, v in (("idleStopMinutes", idle), ("budgetUsd", budget_usd))
                             if v is not None)
        out.append(f"{NAMESPACE}:{API_KEY} is required with {given}: the caretaker deletes the VMs with a Hyperstack "
                   f"API key of its own (it sits on the VM, see the README); set it with: pulumi config set --secret "
                   f"{NAMESPACE}:{API_KEY} <key>")
    if minute_seconds < 60 and not test_clock(api_url_value):
        out.append(f"{NAMESPACE}:caretakerTiming.minuteSeconds {minute_seconds:g} shortens every minute of "
                   f"idleStopMinutes below its floor; it is a test clock, only for a caretakerApiUrl that is an "
                   f"emulator beside the stack (plain http:// to loopback or a private address), not {api_url_value}")
    if budget_usd is not None and (usd_per_hour is None or usd_per_hour < RATE_MIN_USD):
        rate = "no price" if usd_per_hour is None else f"${usd_per_hour:.2g}/h"
        out.append(f"{NAMESPACE}:budgetUsd needs the GPU VMs' hourly rate, which the caretaker counts on with while "
                   f"the billing history does not answer; flavor {flavor} has {rate}: set a real one with: pulumi "
                   f"config set {NAMESPACE}:gpuHourlyPriceUsd <USD per GPU-hour>")
    return out


def warnings(idle: int | None, budget_usd: float | None, usd_per_hour: float | None, poll_seconds: float) -> list[str]:
    """What a guard set this way leaves open, said before anything bills."""
    if idle is None and budget_usd is None:
        return []
    out = [f"{NAMESPACE}:{API_KEY} sits on the VM that holds the endpoint: Hyperstack keys are not scoped, so "
           "whoever gets root there holds the account (README, \"The caretaker\")"]
    if budget_usd is not None and usd_per_hour:
        hours = budget_usd / usd_per_hour
        overshoot = usd_per_hour * poll_seconds / 3600
        if hours < 1:
            out.append(f"{NAMESPACE}:budgetUsd {budget_usd:g} buys {hours * 60:.0f} minutes at ${usd_per_hour:,.2f}/h,"
                       " less than a bring-up takes")
        out.append(f"{NAMESPACE}:budgetUsd is a hard stop checked every {poll_seconds:g} s: it may bill up to "
                   f"${overshoot:,.2f} (one poll at the stack's rate) plus the deletes' own minutes past it")
    return out
