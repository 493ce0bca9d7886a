"""The bring-up drawn as a timeline: one row per node, one bar per step, from the steps' own start and end marks.

    pulumi stack export | kimi-cluster timeline - [--out timeline.png | --out timeline.svg]

Every node step prints `KIMI-STEP rank=<r> step=<name> start|end <UTC ISO time>`
(kimi_cluster/plan/templates/_prelude.sh.j2), so
the stdout that pulumi-command keeps in the state of each command is enough to draw it: the stack's export carries
it. Writes PNG or SVG (by the file's extension) with matplotlib and prints the same bars as a table.
"""

from __future__ import annotations

import argparse
import json
import sys

from kimi_cluster.operator.stack_state import read_capped
from kimi_cluster.operator.timeline_report import TimelineError, out_problem, table, write_timeline


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="kimi-cluster timeline", description=__doc__.splitlines()[0])
    ap.add_argument("state", help="`pulumi stack export` JSON; - reads stdin")
    ap.add_argument("--out", default="timeline.png", help="PNG or SVG to write (default timeline.png)")
    ap.add_argument("--title", default="kimi-cluster bring-up")
    args = ap.parse_args(argv)
    problem = out_problem(args.out)
    if problem:
        print(f"error: --out {args.out}: {problem}", file=sys.stderr)
        return 2
    try:
        doc = json.loads(read_capped(args.state))
    except (OSError, ValueError, RecursionError) as exc:  # RecursionError: JSON nested past Python's stack
        print(f"error: cannot read {args.state}: {str(exc)[:300]}", file=sys.stderr)
        return 2
    try:
        bars = write_timeline(doc, args.out, args.title)
    except TimelineError as exc:
        print(f"error: {args.state}: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"error: --out {args.out}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    print(table(bars))
    if not bars:
        return 1
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
