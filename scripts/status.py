"""What a deployed cluster is doing: per node the VM, the step, the weights' progress and the engine; the endpoint;
uptime and cost so far; one line of advice when something is stuck.

    python -m scripts.status --stack NAME [--watch [SECONDS]] [--json] [--state FILE] [--node-exec FILE]

The state comes from `pulumi stack export --show-secrets` (or --state FILE, such a dump or the sandbox engine's
state file); nodes are reached over SSH with the stack's pinned host keys (or as --node-exec says node commands run,
the sandbox's setting); the VMs' state comes from the Hyperstack API when HYPERSTACK_API_KEY is set. The sandbox:
`python -m scripts.sandbox status`. No secret is ever printed.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from components.node_exec import NodeRunner, SshRunner, remove_key_files_on_signals
from components.settings import SettingsError
from components.settings.loader import load_settings, read_stack_file
from components.stack_state import StackState, StackStateError, export_stack, load_state_file
from components.status_report import PROJECT_DIR, api_client, run

EXIT_USAGE = 2
# --watch: more often than once a second only loads the nodes; a day apart is no longer watching.
WATCH_MIN_S, WATCH_MAX_S = 1.0, 86400.0


def node_runner(node_exec: str | None) -> NodeRunner:
    """SSH, or what the --node-exec file says; ValueError (one sentence naming the file) for a file it cannot use."""
    if not node_exec:
        return SshRunner()
    from sandbox.commands import NodeExecution  # commands run locally, one directory per host

    try:
        data = json.loads(Path(node_exec).read_text(encoding="utf-8"))
    except OSError as err:
        raise ValueError(f"--node-exec {node_exec}: {err.strerror or err}") from None
    except ValueError:
        raise ValueError(f"--node-exec {node_exec} is not JSON (UTF-8 text holding one object)") from None
    if not isinstance(data, dict) or not isinstance(data.get("nodes_dir"), str) \
            or not isinstance(data.get("path_prefix") or [], list) or not isinstance(data.get("env") or {}, dict):
        raise ValueError(f"--node-exec {node_exec} is not an object with nodes_dir (a path) and optional path_prefix "
                         "(a list) and env (an object), as the sandbox writes it")
    try:
        return NodeExecution.from_json(data)
    except (TypeError, ValueError) as err:
        raise ValueError(f"--node-exec {node_exec}: {err}") from None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m scripts.status", description=__doc__.splitlines()[0])
    ap.add_argument("--stack", required=True)
    ap.add_argument("--watch", nargs="?", type=float, const=10.0, default=None, metavar="SECONDS",
                    help="refresh every SECONDS (default 10) until Ctrl-C")
    ap.add_argument("--json", action="store_true", help="print the status as JSON")
    ap.add_argument("--state", help="a stack state file instead of `pulumi stack export --show-secrets`")
    ap.add_argument("--config", help="the stack config file (default Pulumi.<stack>.yaml)")
    ap.add_argument("--node-exec", help="how node commands run, as JSON (default: SSH with the pinned host keys)")
    args = ap.parse_args(argv)
    # time.sleep refuses a negative or NaN interval only after the first report, and an infinite one never wakes.
    if args.watch is not None and not (math.isfinite(args.watch) and WATCH_MIN_S <= args.watch <= WATCH_MAX_S):
        print(f"error: --watch {args.watch:g} is not an interval of {WATCH_MIN_S:g} to {WATCH_MAX_S:g} seconds",
              file=sys.stderr)
        return EXIT_USAGE
    remove_key_files_on_signals()  # a closed terminal (SIGHUP) or a kill (SIGTERM) leaves no private key behind
    config_path = args.config or str(PROJECT_DIR / f"Pulumi.{args.stack}.yaml")
    try:
        raw, other = read_stack_file(config_path)
        settings = load_settings(raw, args.stack)
        runner = node_runner(args.node_exec)
    except (OSError, SettingsError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_USAGE

    def loader() -> StackState:
        return load_state_file(args.state, args.stack) if args.state else export_stack(args.stack, PROJECT_DIR)

    try:
        return run(loader, settings, runner, api_client(args.stack, other),
                   as_json=args.json, watch=args.watch)
    except StackStateError as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
