"""Progress lines from inside a provider operation: `pulumi.log`, but never fatal to the operation.

Under the real CLI the providers run in their own process (Pulumi's dynamic provider host) and log through the
engine. When `pulumi` itself dies (SIGKILL, a crash) that process lives on, and its next log call raises: a VM create
that was polling for ACTIVE would then fail and delete the VM it had just made, so the next `pulumi up` pays for a
second one. A lost progress line costs nothing; the operation finishes, and the next up adopts what it made.
"""

from __future__ import annotations

from collections.abc import Callable

import pulumi


def info(message: str) -> None:
    _emit(pulumi.log.info, message)


def warn(message: str) -> None:
    _emit(pulumi.log.warn, message)


def _emit(log: Callable[[str], None], message: str) -> None:
    try:
        log(message)
    except Exception:  # noqa: BLE001 - the engine that would show the line is gone; the operation goes on
        pass
