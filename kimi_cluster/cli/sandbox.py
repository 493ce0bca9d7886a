"""See kimi-cluster work with no account and no GPU: `kimi-cluster sandbox up | verify | status | destroy`
(up deploys the sandbox stack onto fake nodes, verify runs the verification stack, status is `kimi-cluster status`
against the sandbox, `refresh` is `pulumi refresh` of its stack, `reclaim NODE` takes a VM away as the cloud would,
destroy leaves nothing).
"""

from __future__ import annotations

import argparse
import sys

from kimi_cluster.cli.status import watch_problem
from kimi_cluster.operator.stack_state import StackStateError
from kimi_cluster.sandbox.kimi import DEFAULT_WORKDIR, EXIT_USAGE, TOPOLOGIES, Sandbox, SandboxUsageError
from kimi_cluster.settings import SettingsError


def _share(text: str) -> float:
    """A share from 0 to 1."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 <= value <= 1:  # also false for NaN
        raise argparse.ArgumentTypeError(f"{text!r} must be from 0 to 1")
    return value


def _rate(text: str) -> float:
    """A throttle of at least 1 byte a second and at most 100 GB/s: not negative, NaN or infinite."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of bytes per second") from None
    if not 1 <= value <= 1e11:  # also false for NaN
        raise argparse.ArgumentTypeError(f"{text!r} must be from 1 to 1e11 bytes per second")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kimi-cluster sandbox", description=__doc__)
    parser.add_argument("command", choices=["up", "verify", "status", "refresh", "reclaim", "destroy"])
    parser.add_argument("node", nargs="?", help="reclaim: the VM (name or address) the cloud takes away")
    parser.add_argument("--mode", choices=["delete", "error", "unreachable", "stop"], default="delete",
                        help="reclaim: the VM is deleted (default) or left in ERROR, its processes gone either way; "
                             "or unreachable: still ACTIVE, every packet to and from it dropped; or stop: SHUTOFF, "
                             "as a stop in the console leaves it (it still bills)")
    parser.add_argument("--expect-no-changes", action="store_true",
                        help="refresh, up: fail (exit 1) if anything changed, as pulumi's own flag does; up then "
                             "runs pulumi up --expect-no-changes on a deployed sandbox with up's other options "
                             "(--config, --topology, --[no-]kernel-cache, ...): like pulumi, it applies what "
                             "changed, names it and exits 1")
    parser.add_argument("--topology", choices=TOPOLOGIES,
                        help=f"what up deploys (default: {TOPOLOGIES[0]}, or what this workdir already runs)")
    parser.add_argument("--workdir", default=DEFAULT_WORKDIR,
                        help=f"where state, fake nodes, logs and service records live (default {DEFAULT_WORKDIR})")
    parser.add_argument("--config", action="append", default=[], metavar="KEY=VALUE",
                        help="up: a kimi-cluster setting over Pulumi.sandbox.yaml (repeatable; kept for this "
                             "workdir), e.g. --topology custom --config nodeCount=8 --config gpusPerNode=4 ...")
    parser.add_argument("--hub-bytes-per-second", type=_rate, metavar="N",
                        help="up: throttle the fake hub (to watch the download with status)")
    parser.add_argument("--hub-slow-edges", type=_share, metavar="SHARE",
                        help="up: with --hub-bytes-per-second, the fake hub is a CDN whose connections land on a "
                             "slow edge (1/8 of that rate) this share of the time, e.g. 0.7 (xet-core#821)")
    parser.add_argument("--quiet", action="store_true", help="up/destroy: do not echo the engine's progress")
    parser.add_argument("--skip-preview", action="store_true",
                        help="up: pulumi up --skip-preview (the program runs once, not twice; the update still "
                             "names every change)")
    parser.add_argument("--no-timeline", action="store_true",
                        help="up: do not draw the bring-up as timeline.png (saves about 1.5 CPU-seconds)")
    parser.add_argument("--kernel-cache", action=argparse.BooleanOptionalAction, default=None,
                        help="up: --no-kernel-cache deploys without the kernel-cache bucket and its cache steps, for "
                             "a run that is not about warm starts (kept for this workdir; --kernel-cache turns them "
                             "back on)")
    parser.add_argument("--verbose", action="store_true", help="verify: echo the engine's progress too")
    parser.add_argument("--watch", nargs="?", type=float, const=10.0, default=None, metavar="SECONDS",
                        help="status: refresh every SECONDS (default 10) until Ctrl-C")
    parser.add_argument("--json", action="store_true", help="status: print it as JSON")
    # Intermixed: `reclaim --workdir DIR NODE` as well as `reclaim NODE --workdir DIR`.
    args = parser.parse_intermixed_args(argv)
    if (args.topology or args.config or args.no_timeline or args.skip_preview or args.kernel_cache is not None
            or args.hub_bytes_per_second is not None) and args.command != "up":
        parser.error("--topology, --config, --no-timeline, --skip-preview, --[no-]kernel-cache and "
                     "--hub-bytes-per-second apply to up only")
    if args.hub_slow_edges is not None and args.hub_bytes_per_second is None:
        parser.error("--hub-slow-edges needs --hub-bytes-per-second, the fast edges' rate")
    if args.expect_no_changes and args.command not in ("up", "refresh"):
        parser.error("--expect-no-changes applies to up and refresh only")
    if args.expect_no_changes and args.skip_preview:
        parser.error("--skip-preview: up --expect-no-changes reads the preview's plan, so it always previews")
    if (problem := watch_problem(args.watch)) is not None:
        parser.error(problem)
    config: dict[str, str] = {}
    for item in args.config:
        key, sep, value = item.partition("=")
        if not sep or not key:
            parser.error(f"--config expects KEY=VALUE, got {item!r}")
        config[key.removeprefix("kimi-cluster:")] = value
    if "caretakerApiUrl" in config:  # its caretaker deletes VMs by the sandbox's names: only at its own emulator
        parser.error("--config caretakerApiUrl: the sandbox's caretaker always calls the sandbox's own emulator")

    sandbox = Sandbox(args.workdir)
    try:
        if args.command == "refresh":
            from kimi_cluster.sandbox import refresh

            return refresh.refresh(sandbox, expect_no_changes=args.expect_no_changes)
        if args.command == "up":
            return sandbox.up(args.topology, echo=not args.quiet, config=config,
                              hub_bytes_per_second=args.hub_bytes_per_second, hub_slow_edges=args.hub_slow_edges,
                              timeline=not args.no_timeline, kernel_cache=args.kernel_cache,
                              expect_no_changes=args.expect_no_changes, preview=not args.skip_preview)
        if args.command == "verify":
            return sandbox.verify(echo=args.verbose)
        if args.command == "status":
            return sandbox.status(as_json=args.json, watch=args.watch)
        if args.command == "reclaim":
            if not args.node:
                parser.error("reclaim needs the NODE to take away, e.g. kimi-sandbox-r1-node0")
            return sandbox.reclaim(args.node, args.mode)
        return sandbox.destroy(echo=not args.quiet)
    except (SandboxUsageError, SettingsError, StackStateError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:  # outside a Pulumi run (which ends cleanly on its own): one line, no traceback
        print(f"interrupted; `kimi-cluster sandbox destroy --workdir {args.workdir}` removes what is left",
              file=sys.stderr)
        return 130
    except OSError as exc:  # a workdir that cannot be created or written
        print(f"error: {exc.filename or args.workdir}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
