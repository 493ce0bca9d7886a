"""What a deployed cluster is doing: per node the VM, the step, the weights' progress and the engine; the endpoint;
uptime and cost so far; one line of advice when something is stuck.

    kimi-cluster status --stack NAME [--watch [SECONDS]] [--json] [--state FILE]

The state comes from `pulumi stack export --show-secrets` (or --state FILE, such a dump); nodes are reached over
SSH with the stack's pinned host keys; the VMs' state comes from the Hyperstack API when HYPERSTACK_API_KEY is set.
The sandbox: `kimi-cluster sandbox status`. No secret is ever printed.
"""

from __future__ import annotations

import argparse
import math
import sys

from kimi_cluster.blueprint.admission import admit
from kimi_cluster.operator.node_exec import SshRunner, remove_key_files_on_signals
from kimi_cluster.operator.stack_state import StackState, StackStateError, export_stack, load_state_file
from kimi_cluster.operator.status_report import api_client, project_dir, run
from kimi_cluster.settings import SettingsError
from kimi_cluster.settings.loader import load_settings, read_stack_file

EXIT_USAGE = 2
# --watch: more often than once a second only loads the nodes; a day apart is no longer watching.
WATCH_MIN_S, WATCH_MAX_S = 1.0, 86400.0


def watch_problem(watch: float | None) -> str | None:
    """--watch's interval, checked before the first report: time.sleep refuses a negative or NaN interval only
    after it, and an infinite one never wakes (`kimi-cluster sandbox status --watch` too)."""
    if watch is not None and not (math.isfinite(watch) and WATCH_MIN_S <= watch <= WATCH_MAX_S):
        return f"--watch {watch:g} is not an interval of {WATCH_MIN_S:g} to {WATCH_MAX_S:g} seconds"
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="kimi-cluster status", description=__doc__.splitlines()[0])
    ap.add_argument("--stack", required=True)
    ap.add_argument("--watch", nargs="?", type=float, const=10.0, default=None, metavar="SECONDS",
                    help="refresh every SECONDS (default 10) until Ctrl-C")
    ap.add_argument("--json", action="store_true", help="print the status as JSON")
    ap.add_argument("--state", help="a stack state file instead of `pulumi stack export --show-secrets`")
    ap.add_argument("--config", help="the stack config file (default Pulumi.<stack>.yaml)")
    args = ap.parse_args(argv)
    if (problem := watch_problem(args.watch)) is not None:
        print(f"error: {problem}", file=sys.stderr)
        return EXIT_USAGE
    remove_key_files_on_signals()  # a closed terminal (SIGHUP) or a kill (SIGTERM) leaves no private key behind
    config_path = args.config or str(project_dir() / f"Pulumi.{args.stack}.yaml")
    try:
        raw, other = read_stack_file(config_path)
        settings = admit(load_settings(raw, args.stack))
    except (OSError, SettingsError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_USAGE

    def loader() -> StackState:
        return load_state_file(args.state, args.stack) if args.state else export_stack(args.stack, project_dir())

    try:
        return run(loader, settings, SshRunner(), api_client(args.stack, other),
                   as_json=args.json, watch=args.watch)
    except StackStateError as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
