"""The `kimi-cluster` command: one door per tool, each a module of this package with its own `main(argv)`.

    kimi-cluster plan | status | timeline | schedule | verify | sandbox | emulator | config-reference [ARGS...]

Each door keeps the arguments it had as `python -m scripts.<name>`; `kimi-cluster DOOR --help` lists them. A door's
module is imported only when it is asked for, so `kimi-cluster plan` never loads the sandbox or the fakes.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Sequence

# Door -> (module under kimi_cluster.cli, what it does). The order is the order `kimi-cluster --help` lists them in.
DOORS: dict[str, tuple[str, str]] = {
    "plan": ("plan", "what a stack will build and cost, offline (no account, no resource)"),
    "status": ("status", "what a running stack is doing, node by node"),
    "timeline": ("timeline", "draw a bring-up from a stack export"),
    "schedule": ("schedule", "working hours: bring the stack up ahead of each window (an always-on host)"),
    "verify": ("verify", "check a live endpoint: models, chat, reasoning, tools, images, clients"),
    "sandbox": ("sandbox", "the whole flow on this machine: up | verify | status | reclaim | destroy"),
    "emulator": ("emulator", "run the local Hyperstack API emulator on loopback"),
    "config-reference": ("config_reference", "write or check docs/configuration.md from the settings model"),
}
# The doors of the last release (python -m scripts.<old>, from a checkout), for one release.
OLD_DOORS = {"plan": "plan", "status": "status", "timeline": "timeline", "verify_endpoint": "verify",
             "emulator": "emulator", "sandbox": "sandbox", "config_reference": "config-reference"}


def _usage() -> str:
    width = max(len(d) for d in DOORS)
    rows = "\n".join(f"  {door:<{width}}  {what}" for door, (_, what) in DOORS.items())
    return (f"usage: kimi-cluster DOOR [ARGS...]\n\ndoors:\n{rows}\n\n"
            "`kimi-cluster DOOR --help` lists a door's arguments.")


def _door(name: str) -> Callable[[list[str] | None], int]:
    module = importlib.import_module(f"kimi_cluster.cli.{DOORS[name][0]}")
    door: Callable[[list[str] | None], int] = module.main
    return door


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(_usage())
        return 0 if args else 2
    name, rest = args[0], args[1:]
    if name not in DOORS:
        print(f"kimi-cluster: unknown door {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    return _door(name)(rest)


def old_door(old: str, argv: Sequence[str] | None = None) -> int:
    """`python -m scripts.<old>`: says which command it is now, then runs it with the same arguments."""
    new = OLD_DOORS[old]
    print(f"note: `python -m scripts.{old}` is now `kimi-cluster {new}`; the old door goes in the next release",
          file=sys.stderr)
    return _door(new)(list(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    sys.exit(main())
