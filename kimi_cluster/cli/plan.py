"""The plan: what `pulumi up` would build for a stack, its sizing verdict and its cost, with no account needed.

    kimi-cluster plan [--stack NAME | --config FILE] [--json] [--render-dir DIR]

Offline unless a Hyperstack API key is set (HYPERSTACK_API_KEY, or a plain hyperstack:apiKey): then the cost comes
from the live pricebook, and the plan says when it was read and how it differs from the catalog. When the stack is
deployed (the Pulumi CLI on PATH finds it), the plan says if it was deployed by another kimi-cluster release.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from kimi_cluster.blueprint.admission import admit
from kimi_cluster.operator.plan_report import build_plan, format_plan, render_scripts
from kimi_cluster.release import deployed_outputs, release_view
from kimi_cluster.settings import SettingsError
from kimi_cluster.settings.loader import load_settings, plain_credentials_in, read_stack_file


def _drift(stack: str, settings: Any, other: dict[str, Any], hourly: float | None) -> list[str]:
    """The deployed stack's VMs that are not as it made them (a SHUTOFF one with what it still bills), when the
    Hyperstack API can be asked (HYPERSTACK_API_KEY, or the stack's key through `pulumi config get`)."""
    from kimi_cluster.operator.drift_report import drift_lines, stack_nodes
    from kimi_cluster.operator.status_report import api_client

    api = api_client(stack, other)
    nodes = stack_nodes(stack, os.getcwd()) if api is not None else []
    if api is None or not nodes:
        return []
    # A GPU node's price (the front's is a few cents an hour): the plan's, per GPU, times the GPUs a node has.
    per_node = hourly / (settings.nodes * settings.replicas) if hourly else None
    if settings.price is not None:
        per_node = settings.price.usd_per_gpu_hour * settings.gpus_per_node_count
    return drift_lines(api, nodes, settings, per_node)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="kimi-cluster plan", description=__doc__.splitlines()[0])
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--stack", default="dev",
                     help="read Pulumi.<stack>.yaml from the current directory, the Pulumi project (default: dev)")
    src.add_argument("--config", help="read this stack config file instead")
    ap.add_argument("--json", action="store_true", help="print the plan as JSON")
    ap.add_argument("--render-dir", help="also write every VM's rendered scripts here, one folder per VM (each node of "
                    "each replica, and the front), as `pulumi up` runs them; secrets are never rendered")
    args = ap.parse_args(argv)

    path = args.config or os.path.join(os.getcwd(), f"Pulumi.{args.stack}.yaml")
    stack = args.stack
    if args.config:
        base = os.path.basename(args.config)
        named = base.startswith("Pulumi.") and base.endswith(".yaml")
        stack = base[len("Pulumi."):-len(".yaml")] if named else "custom"
    if not os.path.exists(path):
        print(f"error: no stack config at {path}", file=sys.stderr)
        return 2
    if args.render_dir and os.path.exists(args.render_dir) and not os.path.isdir(args.render_dir):
        print(f"error: --render-dir {args.render_dir} is a file; give a directory (it is created if missing)",
              file=sys.stderr)
        return 2
    try:
        raw, other = read_stack_file(path)
        settings = admit(load_settings(raw, stack, plain_credentials_in(
            {**other, **{f"kimi-cluster:{k}": v for k, v in raw.items()}})))
    except SettingsError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1

    plan = build_plan(settings, other, os.path.relpath(path))
    deployed = deployed_outputs(stack, os.getcwd())
    plan["release"] = release_view(deployed)
    plan["drift"] = _drift(stack, settings, other, plan["hourly_cost_usd"]) if deployed else []
    if args.render_dir:
        try:
            plan["rendered"] = render_scripts(settings, args.render_dir)
        except OSError as err:
            print(f"error: --render-dir {args.render_dir}: {err.strerror or err} (give a directory, new or existing)",
                  file=sys.stderr)
            return 2
    try:
        print(json.dumps(plan, indent=2) if args.json else format_plan(plan))
        if plan["release"]["note"] and not args.json:
            print(f"\nRelease: {plan['release']['note']}")
        for line in [] if args.json else plan["drift"]:
            print(f"Drift: {line}")
        if args.render_dir and not args.json:
            print(f"\nRendered {len(plan['rendered'])} scripts into {args.render_dir}")
        sys.stdout.flush()
    except OSError as err:  # a full disk, a closed pipe: said once, and nothing is left for the exit's own flush
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        print(f"error: cannot write the plan to standard output: {err.strerror or err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
