"""Drift under the real CLI: what changed behind Pulumi's back is found by `sandbox refresh` (`pulumi refresh`) and
by `up` alone, and `up` puts it right; a destroy leaves every rule to go with its VM.

Right after `up`, `refresh --expect-no-changes` and `up --expect-no-changes` pass; the latter with a changed
`--config` names the change and fails. A rule deleted behind the stack's
back is dropped by a refresh and made again by `up`; a VM stopped behind its back (SHUTOFF, which still bills) is
reported with its hourly price by refresh and status, and `up` replaces it, saying so; a VM deleted (`reclaim`) is
dropped by a refresh and made again by `up` with its whole chain and rules; a VM of another flavor is drift, which
`up` replaces and never adopts. The destroy of the 4-node stack makes no delete call for a rule, by the emulator's
own request log.
"""

from __future__ import annotations

import io
import re

import pytest

from .conftest import EMPTY, leftover_processes, ok, report

pytestmark = [pytest.mark.flow, pytest.mark.timeout(1200)]

# An up that replaces a node runs its whole chain: a few minutes on a loaded 2-core machine. (The VM replacements
# here run on the 1-node b300x1-vllm; a lost node of the 4-node stack: tests/sandbox/test_lost_node_flow.py.)
REPLACING_UP_S = 900
# The emulator's pricebook: $7.40 per B300 GPU-hour, 8 GPUs a node.
NODE_USD_PER_HOUR = 59.20


def _rules_of(inventory: dict, vm_name: str) -> list[tuple]:
    """The VM's rules as (protocol, first port or 0, from), sorted: what identifies each but its id."""
    vm_id = next(v["id"] for v in inventory["virtual_machines"] if v["name"] == vm_name)
    return sorted((r["protocol"], r["port_range_min"] or 0, r["remote_ip_prefix"]) for r in inventory["security_rules"]
                  if r["vm_id"] == vm_id)


def _vm(inventory: dict, vm_name: str) -> dict:
    return next(v for v in inventory["virtual_machines"] if v["name"] == vm_name)


def test_h100_rule_drift_found_by_refresh_and_up_and_a_destroy_with_no_call_per_rule(sandbox) -> None:
    run = sandbox()
    ok(run("up", "--topology", "h100x4-sglang"))
    # Right after up: nothing to refresh, nothing to change.
    assert "no changes" in ok(run("refresh", "--expect-no-changes"))
    assert "no changes" in ok(run("up", "--expect-no-changes"))
    emulator = run.emulator()

    # A rule deleted behind the stack's back: refresh drops it, and fails when no change was expected.
    before = emulator.inventory()
    ssh_rules = _rules_of(before, "kimi-sandbox-node1")
    emulator.drift("kimi-sandbox-node1", "delete-rule", port=22)
    refreshed = run("refresh", "--expect-no-changes")
    assert refreshed.code == 1, refreshed.output
    assert re.search(r"^  hyperstack:SecurityRule kimi-node1-ssh: deleted", refreshed.output, re.M), refreshed.output
    # up makes it again; then the stack is as the cloud holds it.
    again = ok(run("up"))
    assert _rules_of(emulator.inventory(), "kimi-sandbox-node1") == ssh_rules, again
    ok(run("refresh", "--expect-no-changes"))
    # Deleted again, without a refresh this time: up alone finds it (its diff asks the API) and says so.
    emulator.drift("kimi-sandbox-node1", "delete-rule", port=22)
    found = run("up", "--expect-no-changes")
    assert found.code == 1 and "kimi-node1-ssh: replaced" in found.output, found.output
    assert "is gone from VM" in found.output, found.output
    assert _rules_of(emulator.inventory(), "kimi-sandbox-node1") == ssh_rules

    ok(run("verify"))

    # The destroy: one delete per VM, keypair and environment, none per rule (each goes with its VM).
    from kimi_cluster.sandbox.kimi import Sandbox

    calls_before = len(emulator.requests())
    log = io.StringIO()
    done = Sandbox(run.workdir, out=log).cli.destroy(Sandbox(run.workdir, out=log).cli.cluster, echo=False,
                                                     timeout=600)
    assert done["ok"], done
    deletes = [r["path"] for r in emulator.requests()[calls_before:] if r["method"] == "DELETE"]
    rule_deletes = [p for p in deletes if "/sg-rules/" in p]
    vm_deletes = [p for p in deletes if re.fullmatch(r"/core/virtual-machines/\d+", p)]
    report(f"destroy of the 4-node sandbox: {len(deletes)} DELETE calls ({len(vm_deletes)} VMs, "
           f"{len(rule_deletes)} rules of {len(before['security_rules'])})")
    assert rule_deletes == [] and len(vm_deletes) == 4, deletes
    assert emulator.inventory() == EMPTY
    ok(run("destroy"))
    assert leftover_processes(run.workdir) == []


def test_b300_a_vm_deleted_behind_the_stacks_back_comes_back_with_its_chain(sandbox) -> None:
    run = sandbox()
    ok(run("up", "--topology", "b300x1-vllm"))
    emulator = run.emulator()
    rules = _rules_of(emulator.inventory(), "kimi-sandbox-node0")
    ok(run("reclaim", "kimi-sandbox-node0"))
    dropped = run("refresh", "--expect-no-changes")
    assert dropped.code == 1, dropped.output
    assert "hyperstack:VirtualMachine kimi-node0: deleted" in dropped.output, dropped.output
    assert "hyperstack:SecurityRule kimi-node0-ssh: deleted" in dropped.output, dropped.output
    back = ok(run("up", timeout=REPLACING_UP_S))
    assert "kimi-node0-launch" in back and "kimi-ready-wait" in back, back
    assert _rules_of(emulator.inventory(), "kimi-sandbox-node0") == rules
    ok(run("refresh", "--expect-no-changes"))
    ok(run("up", "--expect-no-changes"))
    # A changed setting is a change (it was dropped unread, and "no changes" said): as pulumi's own flag does, the
    # up applies it, names what changed and exits 1; the workdir keeps it, as up keeps it, so the next check passes.
    rotated = run("up", "--expect-no-changes", "--config", "apiKeyVersion=2")
    assert rotated.code == 1 and "none expected" in rotated.output, rotated.output
    assert re.search(r"^  \S+ kimi-\S+: (changed|replaced)", rotated.output, re.M), rotated.output
    assert "no changes" in ok(run("up", "--expect-no-changes"))
    ok(run("verify"))
    ok(run("destroy"))
    assert emulator.url and leftover_processes(run.workdir) == []


def test_b300_a_vm_stopped_or_resized_behind_the_stacks_back_is_reported_and_replaced(sandbox) -> None:
    run = sandbox()
    ok(run("up", "--topology", "b300x1-vllm"))
    emulator = run.emulator()
    # A VM stopped behind the stack's back: SHUTOFF still bills. refresh and status say so, with the price.
    ok(run("reclaim", "kimi-sandbox-node0", "--mode", "stop"))
    stopped = run("refresh")
    out = ok(stopped)
    assert re.search(r"hyperstack:VirtualMachine kimi-node0: changed \(.*status 'ACTIVE' -> 'SHUTOFF'", out), out
    assert "VM kimi-sandbox-node0 is SHUTOFF" in out and f"STILL BILLS ${NODE_USD_PER_HOUR:.2f}/h" in out, out
    status = ok(run("status"))
    assert "SHUTOFF" in status and f"STILL BILLS ${NODE_USD_PER_HOUR:.2f}/h" in status, status
    old_id = _vm(emulator.inventory(), "kimi-sandbox-node0")["id"]
    # up replaces it, saying which, and the whole chain runs on the new VM.
    replaced = ok(run("up", timeout=REPLACING_UP_S))
    assert re.search(r"VM kimi-sandbox-node0 \(id \d+\) is SHUTOFF.*it is REPLACED", replaced), replaced
    new = _vm(emulator.inventory(), "kimi-sandbox-node0")
    assert new["id"] != old_id and new["status"] == "ACTIVE"
    assert "kimi-node0-launch" in replaced

    # Another flavor behind the stack's back: drift, reported, replaced, never adopted.
    emulator.drift("kimi-sandbox-node0", "resize", flavor_name="n3-H100x8")
    drifted = run("refresh")
    assert "VM kimi-sandbox-node0 has flavor 'n3-H100x8', the stack's is 'n3-B300-SXM6x8'" in ok(drifted), \
        drifted.output
    ok(run("up", timeout=REPLACING_UP_S))
    assert emulator.inventory()["virtual_machines"] and all(
        v["status"] == "ACTIVE" for v in emulator.inventory()["virtual_machines"])
    ok(run("refresh", "--expect-no-changes"))
    ok(run("verify"))

    ok(run("destroy"))
    assert leftover_processes(run.workdir) == []
