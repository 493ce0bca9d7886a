"""The checks every sandbox benchmark makes of its arguments before it brings anything up: a bring-up takes minutes,
so a bad number or workdir is refused first, in one `error:` line naming the argument."""

from __future__ import annotations

import io
import math
import signal
from pathlib import Path
from typing import Any


def number_problem(flag: str, value: float, low: float, high: float, *, low_open: bool = True) -> str | None:
    """Why `value` is not a finite number in (low, high] (or [low, high] when not low_open), or None."""
    above = value > low if low_open else value >= low
    if not (math.isfinite(value) and above and value <= high):
        side = "more than" if low_open else "at least"
        return f"{flag} {value:g} is not a number {side} {low:g} and at most {high:g}"
    return None


def workdir_problem(workdir: Path) -> str | None:
    """Why the sandbox cannot be brought up in `workdir`, or None: a file, a directory the sandbox did not create,
    a record it cannot read, or a sandbox that is still deployed there."""
    from kimi_cluster.sandbox.kimi import Sandbox
    from kimi_cluster.sandbox.workdir import SandboxUsageError, Workdir

    if workdir.exists() and not workdir.is_dir():
        return f"--workdir {workdir} is a file; give a directory (it is created if missing)"
    try:
        Workdir(workdir.resolve()).claim(create=False)
        Workdir(workdir.resolve()).record()
        deployed = bool(Sandbox(workdir, out=io.StringIO()).resources())
    except SandboxUsageError as err:
        return f"--workdir {workdir}: {err}"
    except (OSError, ValueError, RecursionError) as err:  # RecursionError: JSON nested past Python's stack
        return f"--workdir {workdir}: its stack's checkpoint cannot be read ({type(err).__name__}); pick another"
    if deployed:
        return f"--workdir {workdir} holds a deployed sandbox; destroy it or pick another --workdir"
    return None


def interrupt_on_sigterm() -> None:
    """SIGTERM and SIGHUP (`timeout`, a closed terminal) end a benchmark as Ctrl-C does, through its `finally`, which
    destroys its sandbox; by default they would end the process at once and leave the whole sandbox running."""
    def interrupt(*_: Any) -> None:
        raise KeyboardInterrupt

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, interrupt)
