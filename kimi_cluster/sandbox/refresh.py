"""`kimi-cluster sandbox refresh [--expect-no-changes]` and `up --expect-no-changes`: the drift check Pulumi
names, through the sandbox's own door and the real CLI.

`refresh` runs `pulumi refresh --yes --json` on the sandbox's cluster stack: each provider's `read` asks the
emulator for what it holds, a VM or rule that is gone is dropped from the state, and a changed one is recorded as it
is. Every change is printed naming its resource (and which outputs changed), then what it costs: a VM found SHUTOFF
still bills its hourly price, a VM of another flavor or image than the stack's is drift that the next `up` replaces
(never adopts). With `--expect-no-changes` the CLI fails when anything changed, and so does this command (exit 1).

`up --expect-no-changes` is the sandbox's `up` with `pulumi up --yes --expect-no-changes` (changes.py): right after
an `up` with the same options, both pass.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from kimi_cluster.sandbox.changes import changes, format_change, json_documents, json_errors
from kimi_cluster.sandbox.pulumi_cli import PulumiError

if TYPE_CHECKING:
    from kimi_cluster.sandbox.kimi import Sandbox

REFRESH_DEADLINE_S = 600.0
EXIT_OK, EXIT_CHANGED = 0, 1
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
    from kimi_cluster.hyperstack_api.api import HyperstackClient
    from kimi_cluster.hyperstack_api.market import get_pricebook, price_for_flavor
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
