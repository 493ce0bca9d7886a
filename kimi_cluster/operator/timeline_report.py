"""The bring-up as bars: one row per node, one bar per step, from the steps' own start and end marks.

Every node step prints `KIMI-STEP rank=<r> step=<name> start|end <UTC ISO time>`
(kimi_cluster/plan/templates/_prelude.sh.j2), so
the stdout that pulumi-command keeps in the state of each command is enough to draw it: a stack's export carries
it (a document with the resources at its top level is read too). `bars_from_state` reads the bars, `table` prints
them and `draw` writes PNG or SVG (by the file's extension) with matplotlib, an optional dependency imported only
there.
`kimi-cluster timeline` and `sandbox up` draw with it.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

MARK = re.compile(r"^KIMI-STEP rank=(?P<rank>\d+) step=(?P<step>[a-z0-9_-]+) (?P<what>start|end)"
                  r" (?P<ts>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?Z)(?: rc=(?P<rc>\d+))?$", re.M)
COMMAND_TYPE = "command:remote:Command"
# One colour per step, in chain order (the matplotlib "tab10" palette), so the same step looks the same on every row.
STEP_ORDER = ("ready", "storage", "image", "cache-restore", "weights", "check", "launch", "readiness", "cache-save")
# The files --out may name, by extension (what matplotlib writes and the README shows).
OUT_FORMATS = (".png", ".svg")
MAX_RANK, MAX_RC = 10_000, 255  # no cluster has more nodes; an exit status is one byte


class TimelineError(ValueError):
    """The document cannot be drawn; the message says what in it is wrong."""


@dataclass(frozen=True)
class Bar:
    rank: int
    step: str
    start: datetime
    end: datetime | None
    rc: int | None
    group: str = ""  # with replicas: "replica <r>" or "front" (from the command's resource name), one lane group each

    @property
    def row(self) -> tuple[int, str, int]:
        """Sort key of the bar's row: replica 0, 1, ..., then the front; rank 0 first within a group."""
        order = 10**6 if self.group == "front" else int(self.group.split()[-1]) if self.group else 0
        return order, self.group, self.rank

    @property
    def label(self) -> str:
        node = f"node{self.rank}"
        return "front" if self.group == "front" else f"{self.group} {node}".strip()

    @property
    def seconds(self) -> float | None:
        return (self.end - self.start).total_seconds() if self.end else None


def _parse_ts(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def _shown(m: re.Match[str]) -> str:
    line = m.group(0)
    return repr(line if len(line) <= 120 else line[:100] + "...")


def _mark_time(m: re.Match[str]) -> datetime:
    try:
        return _parse_ts(m["ts"])
    except ValueError:
        raise TimelineError(f"step mark {_shown(m)} has an impossible time {m['ts']!r}") from None


def _number(digits: str | None, limit: int, m: re.Match[str]) -> int | None:
    # Checked by length first: int() of a many-thousand-digit string is refused (or slow) before any comparison.
    if digits is None:
        return None
    if len(digits) > len(str(limit)) or int(digits) > limit:
        raise TimelineError(f"step mark {_shown(m)} holds a number past {limit:,}, which no step prints")
    return int(digits)


def bars_from_text(text: str, group: str = "") -> list[Bar]:
    """Pairs each step's start mark with its end mark (a step without an end is still running, or died)."""
    starts: dict[tuple[int, str], datetime] = {}
    out: list[Bar] = []
    for m in MARK.finditer(text):
        rc, ts = _number(m["rc"], MAX_RC, m), _mark_time(m)
        key = (_number(m["rank"], MAX_RANK, m) or 0, m["step"])
        if m["what"] == "start":
            starts[key] = ts
        elif key in starts:
            out.append(Bar(key[0], key[1], starts.pop(key), ts, rc, group))
    out += [Bar(r, s, t, None, None, group) for (r, s), t in starts.items()]
    return out


_REPLICA = re.compile(r"-r(\d+)-")


def group_of(name: str) -> str:
    """A command's lane group from its resource name (kimi_cluster/deploy/replicas.py, kimi_cluster/deploy/front.py)."""
    if "-front-" in name:
        return "front"
    m = _REPLICA.search(name)
    return f"replica {m.group(1)}" if m else "replica 0"


def _plain(value: Any) -> str:
    """stdout as a string; a secret-wrapped value (encrypted in an export) carries no marks we can read."""
    return value if isinstance(value, str) else ""


def resources_of(doc: Any) -> list[dict[str, Any]]:
    """`pulumi stack export` nests them under deployment; a bare document has them at its top level."""
    shape = "expected `pulumi stack export` JSON (an object with a deployment that holds resources)"
    if not isinstance(doc, dict):
        raise TimelineError(f"the document is a {type(doc).__name__}; {shape}")
    if "deployment" in doc:
        if not isinstance(doc["deployment"], dict):
            raise TimelineError(f"its deployment is a {type(doc['deployment']).__name__}; {shape}")
        doc = doc["deployment"]
    resources = doc.get("resources") or []
    if not isinstance(resources, list) or not all(isinstance(r, dict) for r in resources):
        raise TimelineError(f"its resources are not a list of objects; {shape}")
    return list(resources)


def bars_from_state(doc: dict[str, Any]) -> list[Bar]:
    bars: list[Bar] = []
    commands = [r for r in resources_of(doc) if r.get("type") == COMMAND_TYPE and not r.get("delete")]
    names = [str(r.get("urn", "")).rsplit("::", 1)[-1] for r in commands]
    # Lane groups only when the stack has a front (replicas >= 2): a one-replica stack draws as it always did.
    grouped = any(group_of(n) != "replica 0" for n in names)
    for res, name in zip(commands, names, strict=True):
        outputs = res.get("outputs")
        stdout = _plain(outputs.get("stdout") if isinstance(outputs, dict) else None)
        bars += bars_from_text(stdout, group_of(name) if grouped else "")
    # The latest run of each (row, step): a re-run replaces what an earlier one printed.
    latest: dict[tuple[tuple[int, str, int], str], Bar] = {}
    for b in bars:
        if (b.row, b.step) not in latest or b.start > latest[(b.row, b.step)].start:
            latest[(b.row, b.step)] = b
    return sorted(latest.values(), key=lambda b: (b.row, b.start))


# The caretaker's step (kimi_cluster/plan/steps/table.py) arms the stop once the endpoint is ready: no part of
# bringing it up, and run again by any up that changes only its config (the schedule, the budget, the idle time).
NOT_BRINGUP_STEPS = frozenset({"caretaker"})


def bringup_seconds(doc: dict[str, Any]) -> float | None:
    """The stack's last bring-up as its GPU nodes' step marks show it, from the first step's start to the last one's
    end; None when no step has ended. Neither the front's steps nor the caretaker's count: an up that only changed
    the schedule runs the caretaker's again, and would stretch the bring-up to its end. The scheduler's lead before
    any scheduled up was measured (kimi_cluster/operator/scheduler.py)."""
    bars = [b for b in bars_from_state(doc) if b.group != "front" and b.step not in NOT_BRINGUP_STEPS and b.end]
    if not bars:
        return None
    return (max(b.end for b in bars if b.end) - min(b.start for b in bars)).total_seconds()


def table(bars: list[Bar]) -> str:
    if not bars:
        return "no step marks found (were the commands run by this version of the node scripts?)"
    t0 = min(b.start for b in bars)
    lines = [f"{'node':<8}{'step':<14}{'start s':>9}{'end s':>9}{'took s':>9}"]
    for b in bars:
        end = f"{(b.end - t0).total_seconds():9.1f}" if b.end else "  running"
        took = f"{b.seconds:9.1f}" if b.seconds is not None else "        -"
        lines.append(f"{b.label:<8}{b.step:<14}{(b.start - t0).total_seconds():9.1f}{end}{took}"
                     + (f"  exit {b.rc}" if b.rc else ""))
    total = max((b.end or b.start) for b in bars) - t0
    lines.append(f"first start to last end: {total.total_seconds():.1f} s")
    return "\n".join(lines)


def draw(bars: list[Bar], out: str, title: str = "kimi-cluster bring-up") -> None:
    """One row per node (rank 0 on top), one bar per step, x in seconds from the first start."""
    import matplotlib

    matplotlib.use("Agg")  # no display: write a file
    import matplotlib.pyplot as plt

    t0 = min(b.start for b in bars)
    t_end = max((b.end or b.start) for b in bars)
    ranks = sorted({b.row for b in bars})
    steps = [s for s in STEP_ORDER if any(b.step == s for b in bars)]
    steps += sorted({b.step for b in bars} - set(steps))
    colours = {s: plt.get_cmap("tab10")(i % 10) for i, s in enumerate(steps)}
    # Steps that overlap on one node (image pull and kernel-cache restore alongside the weights) get their own lanes;
    # the head's proxy starts once its image is pulled, so it follows the pull in that lane.
    lanes = {"image": 1, "proxy": 1, "cache-restore": 2, "front-ready": 1}
    offsets = {0: 0.1, 1: -0.2, 2: -0.5}
    fig, ax = plt.subplots(figsize=(12, 1.0 + 0.8 * len(ranks)))
    for b in bars:
        row = ranks.index(b.row)
        lane = lanes.get(b.step, 0)
        left = (b.start - t0).total_seconds()
        width = max(((b.end or t_end) - b.start).total_seconds(), 0.05)
        y = row + offsets[lane]
        ax.broken_barh([(left, width)], (y, 0.25), facecolors=colours[b.step],
                       edgecolor="red" if b.rc else "none", hatch="//" if b.end is None else None)
        if width > (t_end - t0).total_seconds() / 40:
            ax.text(left + width / 2, y + 0.125, b.step, ha="center", va="center", fontsize=7)
    ax.set_yticks(range(len(ranks)))
    labels = {b.row: b.label for b in bars}
    ax.set_yticklabels([(labels[r] if r[1] else f"node {r[2]}") + (" (head)" if r[2] == 0 and r[1] != "front"
                                                                   else "") for r in ranks])
    ax.invert_yaxis()
    ax.set_xlabel("seconds since the first step started")
    ax.set_title(f"{title}: {(t_end - t0).total_seconds():.1f} s, started {t0:%Y-%m-%d %H:%M:%S} UTC")
    ax.legend(handles=[plt.Rectangle((0, 0), 1, 1, color=colours[s]) for s in steps], labels=steps,
              loc="upper center", bbox_to_anchor=(0.5, -0.25), ncol=len(steps), fontsize=8, frameon=False)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)


def write_timeline(doc: dict[str, Any], out: str, title: str = "kimi-cluster bring-up") -> list[Bar]:
    """Draw a state document's bars into `out`; returns them (nothing is written when there are none)."""
    bars = bars_from_state(doc)
    if bars:
        draw(bars, out, title)
    return bars


def out_problem(out: str) -> str | None:
    """Why the picture cannot be written to `out`, or None; asked before the state is read or anything drawn."""
    if os.path.splitext(out)[1].lower() not in OUT_FORMATS:
        return f"give a file ending in {' or '.join(OUT_FORMATS)}"
    if os.path.isdir(out):
        return "is a directory; give a file name"
    parent = os.path.dirname(out) or "."
    if not os.path.isdir(parent):
        return f"the directory {parent} does not exist"
    return None
