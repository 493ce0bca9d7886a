"""Waiting on Hyperstack: look again and again until what is waited for is there, saying each change of state, and
give up at a deadline naming what was last seen."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from kimi_cluster.deploy.hyperstack_providers import progress
from kimi_cluster.deploy.hyperstack_providers.failures import ProvisioningError
from kimi_cluster.hyperstack_api.api import HyperstackError

T = TypeVar("T")


@dataclass(frozen=True)
class Look(Generic[T]):
    """One look at what poll() waits for: `value` once the wait is over; `state`, short, is logged whenever it
    changes, with `waiting_for` (what has to happen next); `seen`, everything looked at, goes into the timeout
    error."""

    state: str
    value: T | None = None
    waiting_for: str = ""
    seen: str = ""


def poll(subject: str, what: str, timeout: float, interval: float, probe: Callable[[], Look[T]]) -> T:
    """Call `probe` until it returns a value; give up at the deadline naming what and what was last seen.

    Each change of state is logged through pulumi.log.info with the time waited so far and what comes next: under
    the Pulumi CLI these lines are the only sign of life during a VM boot. The first waits are short and double up
    to `interval`: many transitions (a floating IP attaching, a deleted VM answering 404) finish within seconds, and
    four extra GETs are far inside the 500 requests/minute budget.
    """
    started = time.monotonic()
    deadline = started + timeout
    wait = min(1.0, interval)
    last: str | None = None
    while True:
        look = probe()
        if look.state != last:
            _log_change(subject, last, look, time.monotonic() - started)
            last = look.state
        if look.value is not None:
            return look.value
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise ProvisioningError(
                f"gave up after {timeout:g} s waiting for {what} (last seen: {look.seen or look.state})")
        time.sleep(min(wait, remaining))
        wait = min(wait * 2, interval)


def _log_change(subject: str, before: str | None, look: Look[Any], elapsed: float) -> None:
    if before is None:
        if look.value is None:  # a wait that is over at the first look needs no sign of life
            progress.info(f"{subject}: {look.state}; waiting for {look.waiting_for}")
        return
    line = f"{subject}: {before} → {look.state} after {_duration(elapsed)}"
    progress.info(line + (f"; waiting for {look.waiting_for}" if look.value is None else ""))


def _duration(seconds: float) -> str:
    """3 min 10 s, 42 s, 1 h 5 min: how long a wait has lasted, as a person would say it."""
    total = int(round(seconds))
    if total < 60:
        return f"{total} s"
    if total < 3600:
        return f"{total // 60} min {total % 60} s"
    return f"{total // 3600} h {total % 3600 // 60} min"



def unanswered(err: HyperstackError, waiting_for: str) -> Look[Any]:
    """A look that got no usable answer (timeout, 5xx, 429): try again."""
    return Look(f"no answer ({err.error_reason})", None, waiting_for, str(err))
