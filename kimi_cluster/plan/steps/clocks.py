"""A step's clock from its table entry: the deadline (kimi-cluster:stepDeadlineMinutes overrides it) and the custom
timeout that bounds its dial. The numbers are Timing's (kimi_cluster/settings/timing.py); the rules are the table's.
"""

from __future__ import annotations

from kimi_cluster.plan.steps.model import Clock
from kimi_cluster.plan.steps.table import BY_NAME
from kimi_cluster.settings.timing import DIAL_ALLOWANCE_S, Timing


def deadline_s(step: str, timing: Timing) -> int:
    """How long `step` may run on the node before it is stopped there; its custom_timeouts derive from this.

    pulumi-command never stops a running command (custom_timeouts cut short only the dial), so a hung script
    would hang `pulumi up` for good: every step runs under `timeout` with this deadline (remote_command_text).
    Each default outlasts the step's own waits; kimi-cluster:stepDeadlineMinutes overrides it per step.
    """
    override = timing.step_deadline_minutes.get(step)
    if override:
        return max(1, round(override * 60))
    entry = BY_NAME.get(step)
    if entry is None:
        raise ValueError(f"step {step!r} has no deadline; every node step is an entry of the step table")
    return entry.deadline(timing)


def custom_timeout(deadline: int) -> str:
    """A step's custom_timeouts (create and update), as a Go duration: its deadline plus the dial allowance."""
    return f"{-(-(deadline + DIAL_ALLOWANCE_S) // 60)}m"


def clock(step: str, timing: Timing) -> Clock:
    d = deadline_s(step, timing)
    return Clock(d, custom_timeout(d))
