"""kimi-cluster:nodeTiming, the advanced override of the node scripts' waits and retries
(kimi_cluster/settings/timing.py).

A JSON object whose camelCase keys are Timing's fields, e.g. {"settleSeconds": 1, "pollSeconds": 5}: unset or {}
is Timing() exactly. Every value is a positive finite number (a whole one where the field counts seconds or tries
as an int) under a bound far beyond any real need, so no setting can overflow a deadline or spin a script.
"""

from __future__ import annotations

import math
import re
from dataclasses import fields
from typing import Any

from kimi_cluster.settings.errors import close_match, shown
from kimi_cluster.settings.keys import NAMESPACE
from kimi_cluster.settings.rules import json_text_object
from kimi_cluster.settings.timing import Timing

# Timing's two long deadlines, the steps' deadlines and the kernel-cache transfers have keys of their own; nodeTiming
# leaves them to those (the blueprint fills them in).
_OWN_KEYS = {"download_timeout_s": "downloadTimeoutMinutes", "readiness_timeout_s": "readinessTimeoutMinutes",
             "step_deadline_minutes": "stepDeadlineMinutes", "cache_restore_minutes": "kernelCache",
             "cache_save_minutes": "kernelCache"}


def _camel(name: str) -> str:
    first, *rest = name.split("_")
    return first + "".join(part.title() for part in rest)


# Config key -> Timing field, and whether the field takes whole numbers only (its annotation, a string under
# `from __future__ import annotations`).
FIELDS = {_camel(f.name): f.name for f in fields(Timing) if f.name not in _OWN_KEYS}
_INT_FIELDS = {f.name for f in fields(Timing) if str(f.type) == "int"}
# A day bounds every wait and deadline (a step's whole deadline is bounded by stepDeadlineMinutes' week anyway);
# the counts and intervals have tighter bounds of their own.
DAY_S = 24 * 3600
# A settle is a pause before checking the container still runs: past ten minutes it only delays every launch.
MAXIMA = {"pollSeconds": 3600, "fastPollSeconds": 600, "pullAttempts": 100, "logTail": 100_000,
          "settleSeconds": 600, "proxySettleSeconds": 600}
# A poll renders `sleep <seconds>` into every polled wait: below a tenth of a second it only spins the node's CPU.
MINIMA = {"fastPollSeconds": 0.1}  # pollSeconds is whole seconds, 1 at least
# A minute: none of these steps' own work (cloud-init, the driver listing the GPUs, docker restarting, an image
# pulled, a container started and checked, a proxy written and started, 1.5 TB read) is done in less on a fresh VM,
# so a shorter timeout fails every bring-up after the GPUs bill.
TIMEOUT_MIN_S = 60
_TIMEOUTS = ("cloudInitTimeoutS", "gpuTimeoutS", "dockerTimeoutS", "pullTimeoutS", "storageTimeoutS",
             "checkTimeoutS", "launchTimeoutS", "proxyTimeoutS")
# The waits that re-check every fastPollSeconds: each needs room for two checks.
_POLLED_WAITS = ("cloudInitTimeoutS", "gpuTimeoutS", "dockerTimeoutS", "pullTimeoutS")
_EXAMPLE = '\'{"settleSeconds": 1, "pollSeconds": 5}\''


def _number(key: str, value: Any) -> int | float:
    """`value` as the number Timing's field `key` takes, or ValueError naming the key."""
    whole = FIELDS[key] in _INT_FIELDS
    kind = "a positive whole number" if whole else "a positive number"
    number: Any = value
    if isinstance(value, str):  # `pulumi config set --path` may store a number as text
        text = value.strip()
        try:
            number = int(text) if re.fullmatch(r"[0-9]+", text) else float(text) if not whole else None
        except ValueError:
            number = None
    if isinstance(number, bool) or not isinstance(number, int if whole else (int, float)):
        raise ValueError(f"{key}: {shown(value)} is not {kind}")
    if isinstance(number, float) and not math.isfinite(number) or number <= 0:
        raise ValueError(f"{key}: {shown(value)} is not {kind}")
    high = MAXIMA.get(key, DAY_S)
    if number > high:
        raise ValueError(f"{key}: {shown(value)} is more than {high:,}, beyond any node's need")
    if number < MINIMA.get(key, 0):
        raise ValueError(f"{key}: {shown(value)} s would spin every polled wait on the nodes; at least "
                         f"{MINIMA[key]:g} s")
    if key in _TIMEOUTS and number < TIMEOUT_MIN_S:
        raise ValueError(f"{key}: {shown(value)} is shorter than the step's own work takes on a fresh VM; at least "
                         f"{TIMEOUT_MIN_S} s")
    return number


def node_timing(v: Any) -> dict[str, int | float]:
    """The nodeTiming object, checked: camelCase Timing fields to positive bounded numbers."""
    if v is None or isinstance(v, str) and not v.strip():
        return {}
    expected = f"expected a JSON object of timing -> number, e.g. {_EXAMPLE}"
    v = json_text_object(v, expected)
    if not isinstance(v, dict):
        raise ValueError(expected)
    out: dict[str, int | float] = {}
    for key, value in v.items():
        if key not in FIELDS:
            own = {_camel(f): k for f, k in _OWN_KEYS.items()}.get(str(key))
            if own:
                raise ValueError(f"{key} is set by {NAMESPACE}:{own}, not here")
            close = close_match(str(key), list(FIELDS))
            hint = f" (did you mean {close}?)" if close else ""
            raise ValueError(f"{shown(key)} is not a node timing{hint}; known: {', '.join(FIELDS)}")
        out[key] = _number(key, value)
    poll = out.get("fastPollSeconds", Timing.fast_poll_seconds)
    for key in _POLLED_WAITS:
        wait = out.get(key, getattr(Timing, FIELDS[key]))
        if key in out or "fastPollSeconds" in out:
            if wait < 2 * poll:
                raise ValueError(f"{key}: {wait:g} s leaves no room for two checks fastPollSeconds ({poll:g} s) "
                                 "apart; shorten fastPollSeconds or lengthen the wait")
    return out


def timing_of(node_timing: dict[str, int | float]) -> Timing:
    """The Timing a checked nodeTiming object gives: its fields over Timing()'s defaults."""
    # node_timing() gave each field the type it takes (int or float); Timing's own types say which.
    fields: dict[str, Any] = {FIELDS[key]: value for key, value in node_timing.items()}
    return Timing(**fields)
