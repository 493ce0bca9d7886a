"""The plan: what `pulumi up` would build for a stack, its sizing verdict and its cost, with no account needed.

    kimi-cluster plan [--stack NAME | --config FILE] [--json] [--render-dir DIR]

Offline unless a Hyperstack API key is set (HYPERSTACK_API_KEY, or a plain hyperstack:apiKey): then the cost comes
from the live pricebook, and the plan says when it was read and how it differs from the catalog.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from kimi_cluster.operator.plan_report import build_plan, format_plan, render_scripts
from kimi_cluster.plan.admission import admit
from kimi_cluster.settings import SettingsError
from kimi_cluster.settings.loader import load_settings, plain_credentials_in, read_stack_file


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
    if args.render_dir:
        try:
            plan["rendered"] = render_scripts(settings, args.render_dir)
        except OSError as err:
            print(f"error: --render-dir {args.render_dir}: {err.strerror or err} (give a directory, new or existing)",
                  file=sys.stderr)
            return 2
    try:
        print(json.dumps(plan, indent=2) if args.json else format_plan(plan))
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
