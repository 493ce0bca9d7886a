"""`kimi-cluster sandbox refresh [--expect-no-changes]` and `up --expect-no-changes`: the drift check Pulumi
names, through the sandbox's own door and the real CLI.

`refresh` runs `pulumi refresh --yes --json` on the sandbox's cluster stack: each provider's `read` asks the
emulator for what it holds, a VM or rule that is gone is dropped from the state, and a changed one is recorded as it
is. Every change is printed naming its resource (and which outputs changed), then what it costs: a VM found SHUTOFF
still bills its hourly price, a VM of another flavor or image than the stack's is drift that the next `up` replaces
(never adopts). With `--expect-no-changes` the CLI fails when anything changed, and so does this command (exit 1).

`up --expect-no-changes` is the sandbox's `up` with `pulumi up --yes --expect-no-changes`: every option of `up`
(`--config`, `--topology`, `--[no-]kernel-cache`, `--hub-bytes-per-second`) counts, as it would in an `up`, and the
CLI applies what changed before it fails. Right after an `up` with the same options, both pass.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kimi_cluster.sandbox.pulumi_cli import PulumiError

if TYPE_CHECKING:
    from kimi_cluster.sandbox.kimi import Sandbox

REFRESH_DEADLINE_S = 600.0
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


def vm_findings(sandbox: Sandbox, hourly_usd: Mapping[str, float]) -> list[str]:
    """After a refresh, what the state's VMs are as the cloud holds them: each SHUTOFF one with what it still costs,
    each of another flavor or image than the stack asked for."""
    lines = []
    for res in sandbox.resources():
        if not str(res.get("type", "")).endswith("hyperstack:VirtualMachine"):
            continue
        outs, wanted = res.get("outputs") or {}, res.get("inputs") or {}
        name = str(outs.get("name") or res["urn"].rsplit("::", 1)[-1])
        if outs.get("status") in ("SHUTOFF", "STOPPING"):
            price = hourly_usd.get(name)
            cost = f"${price:,.2f}/h" if price is not None else "its hourly price"
            lines.append(f"VM {name} is {outs['status']}: stopped behind Pulumi's back, it serves nothing and STILL "
                         f"BILLS {cost}; the next up replaces it (a new VM, its whole chain and rules)")
        for key in ("flavor_name", "image_name"):
            if wanted.get(key) and outs.get(key) and wanted[key] != outs[key]:
                lines.append(f"VM {name} has {key.removesuffix('_name')} {outs[key]!r}, the stack's is "
                             f"{wanted[key]!r}: drift, never adopted; the next up replaces it")
    return lines


def hourly_prices(sandbox: Sandbox) -> dict[str, float]:
    """Each live VM's hourly price, by name, from the emulator's pricebook (what Hyperstack would bill it)."""
    from kimi_cluster.hyperstack.api import HyperstackClient
    from kimi_cluster.hyperstack.market import get_pricebook, price_for_flavor
    from kimi_cluster.sandbox.workdir import emulator_key

    record = sandbox.dir.record()
    if not record.get("emulator_url"):
        return {}
    api = HyperstackClient(record["emulator_url"], sandbox.dir.secret("hyperstack_api_key", emulator_key),
                           retry_base_seconds=0.2)
    try:
        book = get_pricebook(api)
        prices = {}
        for vm in api.list_vms():
            flavor = vm.get("flavor") or {}
            live = price_for_flavor(book, str(flavor.get("name")), str(flavor.get("gpu") or ""),
                                    int(flavor.get("gpu_count") or 0))
            if live is not None:
                prices[str(vm.get("name"))] = live.usd_per_vm_hour
        return prices
    except Exception:  # noqa: BLE001 - the prices are a courtesy of the report; the refresh itself has been made
        return {}


def _stack(sandbox: Sandbox) -> Any:
    stack = sandbox.cli.cluster
    if not sandbox.checkpoint_path.exists() or not stack.config_file.exists():
        from kimi_cluster.sandbox.workdir import SandboxUsageError

        raise SandboxUsageError(f"nothing deployed in {sandbox.dir.root}: run kimi-cluster sandbox up first")
    return stack


def refresh(sandbox: Sandbox, expect_no_changes: bool = False) -> int:
    """`pulumi refresh` of the cluster stack; prints each change and the VMs' drift; exit 1 when --expect-no-changes
    and something changed (as the CLI does), 0 otherwise."""
    sandbox.dir.claim(create=False)
    with sandbox.dir.exclusive():
        stack = _stack(sandbox)
        args = ["refresh", "--yes", "--json", "--stack", stack.name]
        if expect_no_changes:
            args.append("--expect-no-changes")
        try:
            output, failed = sandbox.cli.cli().run(args, cwd=stack.project_dir, timeout=REFRESH_DEADLINE_S), None
        except PulumiError as err:
            output, failed = err.output, err
        rows = changes(json_documents(output))
        for row in rows:
            sandbox.say(format_change(row))
        findings = vm_findings(sandbox, hourly_prices(sandbox))
        for line in findings:
            sandbox.say(line)
        if failed is not None:
            reasons = json_errors(json_documents(output))
            for reason in reasons:
                sandbox.say(f"FAILED: {reason}")
            if reasons or not rows:
                sandbox.say(f"sandbox refresh: pulumi refresh failed (exit {failed.returncode})")
                return EXIT_CHANGED
            sandbox.say(f"sandbox refresh: {len(rows)} change(s), none expected (--expect-no-changes)")
            return EXIT_CHANGED
        sandbox.say(f"sandbox refresh: {len(rows)} change(s)" if rows else "sandbox refresh: no changes: the "
                    "stack's state is what the cloud holds")
        return EXIT_OK


def up_expecting_no_changes(sandbox: Sandbox, base: Path, config: Mapping[str, str],
                             secret_config: Mapping[str, str]) -> int:
    """`pulumi up --yes --expect-no-changes` on the cluster stack with the config `Sandbox.up` made of its options
    (services started, record saved): each change named, exit 1 when there was one (the CLI has applied it)."""
    result = sandbox.cli.up(sandbox.cli.cluster, base, config, secret_config, echo=False, timeout=UP_DEADLINE_S,
                            expect_no_changes=True)
    if result.get("interrupted"):
        sandbox.say("sandbox up --expect-no-changes: stopped; what was done is in the stack's checkpoint")
        return EXIT_INTERRUPTED
    docs = json_documents(result.get("output") or "")
    rows = changes(docs)
    for row in rows:
        sandbox.say(format_change(row))
    for note in json_errors(docs, "warning"):
        sandbox.say(f"  note: {note}")
    if not result.get("ok"):
        for reason in json_errors(docs):
            sandbox.say(f"FAILED: {reason}")
        sandbox.say(f"sandbox up --expect-no-changes: {len(rows)} change(s), none expected "
                    f"(exit {result.get('code', 1)})")
        return EXIT_CHANGED
    sandbox.say("sandbox up --expect-no-changes: no changes")
    return EXIT_OK
