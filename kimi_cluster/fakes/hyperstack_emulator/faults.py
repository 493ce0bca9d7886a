"""The faults a test arms on the emulator, and the book that holds them until a request takes one.

The injection points: `Emulator.inject` arms a fault (emulator.py); the request pipeline takes RateLimit, ServerError
and LostCreateResponse (dispatch.py); a VM's create takes VmError and StuckInBuild (vms.py); OutOfStock and RevokeKey
change the state at once. A new kind of fault is a dataclass here, a member of `Fault`, and (for a test in another
process) an entry of `ADMIN_KINDS`.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, TypeVar


@dataclass
class RateLimit:
    """The next `count` matching requests answer 429."""

    count: int
    method: str | None = None
    path: str | None = None  # glob on the path after /v1, e.g. "/core/virtual-machines*"


@dataclass
class ServerError:
    """The next `count` matching requests answer `status` (5xx) without doing anything."""

    count: int
    status: int = 500
    method: str | None = None
    path: str | None = None


@dataclass
class VmError:
    """The next created VM (or the one with this name) ends its build in ERROR."""

    name: str | None = None
    reason: str = "No valid host was found. There are not enough hosts available."


@dataclass
class StuckInBuild:
    """The next created VM (or the one with this name) never leaves BUILD."""

    name: str | None = None


@dataclass
class LostCreateResponse:
    """The next successful POST to `path` (glob) takes effect, then its answer is lost: a 500, or a dropped
    connection."""

    mode: Literal["500", "drop"] = "500"
    path: str = "/core/virtual-machines"


@dataclass
class OutOfStock:
    flavor_name: str
    region: str = "CANADA-1"


@dataclass
class RevokeKey:
    key: str


Fault = RateLimit | ServerError | VmError | StuckInBuild | LostCreateResponse | OutOfStock | RevokeKey

# The kinds POST /_emulator/faults arms by name, for a test that runs the emulator in another process.
ADMIN_KINDS: dict[str, type] = {"rate-limit": RateLimit, "server-error": ServerError, "vm-error": VmError,
                                "stuck-in-build": StuckInBuild, "lost-create": LostCreateResponse}

F = TypeVar("F")


class FaultBook:
    """The armed faults, in the order they were armed; the caller holds the emulator's lock."""

    def __init__(self) -> None:
        self._faults: list[Any] = []

    def arm(self, fault: Any) -> None:
        self._faults.append(fault)

    def clear(self) -> None:
        self._faults.clear()

    def take(self, kind: type[F], predicate: Callable[[F], bool] = lambda f: True) -> F | None:
        """The first armed fault of this kind that `predicate` accepts: a counted one (RateLimit, ServerError) is
        used up after `count` takes, any other after one."""
        for fault in self._faults:
            if isinstance(fault, kind) and predicate(fault):
                if isinstance(fault, (RateLimit, ServerError)):
                    fault.count -= 1
                    if fault.count <= 0:
                        self._faults.remove(fault)
                else:
                    self._faults.remove(fault)
                return fault
        return None


def for_vm(name: str) -> Callable[[VmError | StuckInBuild], bool]:
    """A fault predicate: the fault names this VM, or no VM at all."""
    return lambda fault: fault.name in (None, name)


def matches(method: str, path: str, want_method: str | None, want_path: str | None) -> bool:
    return (want_method is None or want_method == method) and (want_path is None or fnmatch.fnmatch(path, want_path))
