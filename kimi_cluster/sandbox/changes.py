"""What a `pulumi --json` run changed, one line per resource, and `kimi-cluster sandbox up --expect-no-changes`.

The CLI's `--json` output is its plan, then one engine event a line (refresh.py reads a refresh's with these too).
`up --expect-no-changes` is the sandbox's `up` with `pulumi up --yes --expect-no-changes`: every option of `up`
(`--config`, `--topology`, `--[no-]kernel-cache`, `--hub-bytes-per-second`) counts as it would in an `up`, and, as
the real CLI does, what changed is applied before it fails: each change is named, and the exit is 1.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from kimi_cluster.sandbox.cli_stacks import CliStacks

UP_DEADLINE_S = 1800.0
EXIT_OK, EXIT_CHANGED, EXIT_INTERRUPTED = 0, 1, 130
# What a refresh or an up does to a resource and says nothing changed.
_UNCHANGED = ("same", "refresh", "read")
_OP_WORDS = {"delete": "deleted: gone from the cloud, dropped from the state", "update": "changed",
             "create": "created", "replace": "replaced", "create-replacement": "replaced",
             "delete-replaced": "old copy deleted", "read-discard": "gone", "discard": "gone"}


def json_documents(text: str) -> list[dict[str, Any]]:
    """Every JSON object in the CLI's `--json` output: a refresh prints its plan, then one engine event a line."""
    decoder, i, docs = json.JSONDecoder(), 0, []
    while (start := text.find("{", i)) != -1:
        try:
            doc, i = decoder.raw_decode(text, start)
        except ValueError:
            i = start + 1
            continue
        if isinstance(doc, dict):
            docs.append(doc)
    return docs


def json_errors(docs: Iterable[Mapping[str, Any]], severity: str = "error") -> list[str]:
    """The diagnostics of one severity among the events (the CLI's own refusal of changes excluded: it is the
    verdict); "warning" gives what the providers said, e.g. why a VM is replaced."""
    found = []
    for doc in docs:
        diag = doc.get("diagnosticEvent") or {}
        message = " ".join(str(diag.get("message") or "").split())
        kind = str(diag.get("severity") or "")
        # What a provider logs arrives from its host's stderr: "info#err", the level in the message's first word.
        if kind == "info#err" and message.startswith(f"{severity}: "):
            kind, message = severity, message.removeprefix(f"{severity}: ")
        if kind == severity and message and "no changes were expected" not in message \
                and message not in found:
            found.append(message[:500])
    return found


def _short_type(type_: str) -> str:
    return type_.removeprefix("pulumi-python:dynamic/")


def _changed_keys(old: Mapping[str, Any] | None, new: Mapping[str, Any] | None) -> list[str]:
    before, after = (old or {}).get("outputs") or {}, (new or {}).get("outputs") or {}
    return sorted(k for k in set(before) | set(after) if k != "__provider" and before.get(k) != after.get(k))


def changes(docs: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """What the operation did to each resource that changed: op, type, name, the outputs that changed (old -> new
    for a few short ones), from the engine's resource events (else the plan's steps, for a run that failed early)."""
    found: dict[str, dict[str, Any]] = {}
    planned: dict[str, dict[str, Any]] = {}
    for doc in docs:
        for step in doc.get("steps") or []:
            if step.get("op") not in _UNCHANGED:
                planned[step["urn"]] = {"op": step["op"], "urn": step["urn"], "old": step.get("oldState"),
                                        "new": step.get("newState")}
        event = (doc.get("resOutputsEvent") or {}).get("metadata")
        if event and event.get("op") not in _UNCHANGED:
            # A replacement comes as three events (create-replacement, replace, delete-replaced): one row.
            earlier = found.get(event["urn"])
            if earlier is not None and "replace" in (earlier["op"], event["op"]) or \
                    str(event.get("op")).endswith("-replaced") or str(event.get("op")).endswith("-replacement"):
                event = {**event, "op": "replace", "old": (earlier or event).get("old") or event.get("old")}
            found[event["urn"]] = event
    rows = []
    for urn, event in (found or planned).items():
        old, new = event.get("old"), event.get("new")
        keys = _changed_keys(old, new) if event["op"] == "update" else []
        shown = {k: ((old or {}).get("outputs", {}).get(k), (new or {}).get("outputs", {}).get(k)) for k in keys
                 if all(isinstance(v, (str, int, float, type(None))) and len(str(v)) <= 60
                        for v in ((old or {}).get("outputs", {}).get(k), (new or {}).get("outputs", {}).get(k)))}
        type_ = str(event.get("type") or urn.split("::")[-2].split("$")[-1])
        rows.append({"op": event["op"], "type": _short_type(type_),
                     "name": urn.rsplit("::", 1)[-1], "keys": keys, "values": shown})
    return rows


def format_change(row: Mapping[str, Any]) -> str:
    text = f"  {row['type']} {row['name']}: {_OP_WORDS.get(row['op'], row['op'])}"
    if row["keys"]:
        parts = [f"{k} {row['values'][k][0]!r} -> {row['values'][k][1]!r}" if k in row["values"] else k
                 for k in row["keys"]]
        text += " (" + ", ".join(parts) + ")"
    return text


def up_expecting_no_changes(stacks: CliStacks, say: Callable[[str], None], base: Path, config: Mapping[str, str],
                             secret_config: Mapping[str, str]) -> int:
    """`pulumi up --yes --expect-no-changes` on the cluster stack with the config `Sandbox.up` made of its options
    (services started, record saved): each change named, exit 1 when there was one (the CLI has applied it)."""
    result = stacks.up(stacks.cluster, base, config, secret_config, echo=False, timeout=UP_DEADLINE_S,
                       expect_no_changes=True)
    if result.get("interrupted"):
        say("sandbox up --expect-no-changes: stopped; what was done is in the stack's checkpoint")
        return EXIT_INTERRUPTED
    docs = json_documents(result.get("output") or "")
    rows = changes(docs)
    for row in rows:
        say(format_change(row))
    for note in json_errors(docs, "warning"):
        say(f"  note: {note}")
    if not result.get("ok"):
        for reason in json_errors(docs):
            say(f"FAILED: {reason}")
        say(f"sandbox up --expect-no-changes: {len(rows)} change(s), none expected (exit {result.get('code', 1)})")
        return EXIT_CHANGED
    say("sandbox up --expect-no-changes: no changes")
    return EXIT_OK
