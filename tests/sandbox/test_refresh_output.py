"""What the sandbox reads from the CLI's `--json` output of a refresh, an up and a preview: the changed resources by
name (a replacement's three events as one), the outputs that changed, the providers' warnings, and the upgrade's
verdict. The shapes are the CLI's own (v3.259.0), as it printed them in the drift and upgrade flows."""

from __future__ import annotations

import json

from kimi_cluster.operator.status_gather import advice
from kimi_cluster.sandbox.refresh import changes, format_change, json_documents, json_errors
from kimi_cluster.sandbox.releases import verdict

URN = "urn:pulumi:sandbox::kimi-cluster::kimi:cluster:InferenceCluster$pulumi-python:dynamic/hyperstack:{}::{}"


def _event(op: str, type_: str, name: str, old: dict | None = None, new: dict | None = None) -> str:
    meta = {"op": op, "urn": URN.format(type_, name), "type": f"pulumi-python:dynamic/hyperstack:{type_}",
            "old": old, "new": new}
    return json.dumps({"sequence": 1, "resOutputsEvent": {"metadata": meta}})


PLAN = json.dumps({"config": {}, "steps": [{"op": "refresh", "urn": URN.format("VirtualMachine", "kimi-node0")},
                                            {"op": "delete", "urn": URN.format("SecurityRule", "kimi-node1-ssh")}],
                   "changeSummary": {"delete": 1, "same": 21}}, indent=4)


def test_a_refresh_names_each_change_and_what_changed():
    text = "\n".join([
        PLAN,
        _event("same", "VirtualMachine", "kimi-node0"),
        _event("delete", "SecurityRule", "kimi-node1-ssh"),
        _event("update", "VirtualMachine", "kimi-node2", {"outputs": {"status": "ACTIVE", "vm_id": "1004"}},
               {"outputs": {"status": "SHUTOFF", "vm_id": "1004"}}),
        json.dumps({"diagnosticEvent": {"message": "warning: firewall rule 7 is gone\n\n", "severity": "info#err"}}),
        json.dumps({"diagnosticEvent": {"message": "error: no changes were expected\n", "severity": "error"}}),
    ])
    docs = json_documents("garbage before " + text + " and after")
    rows = changes(docs)
    assert [format_change(r) for r in rows] == [
        "  hyperstack:SecurityRule kimi-node1-ssh: deleted: gone from the cloud, dropped from the state",
        "  hyperstack:VirtualMachine kimi-node2: changed (status 'ACTIVE' -> 'SHUTOFF')"]
    assert json_errors(docs, "warning") == ["firewall rule 7 is gone"]
    assert json_errors(docs) == []  # the CLI's own verdict is not a failure to report


def test_a_replacement_is_one_row_and_a_failed_run_falls_back_to_its_plan():
    text = "\n".join(_event(op, "SecurityRule", "kimi-node0-api") for op in
                     ("create-replacement", "replace", "delete-replaced"))
    assert [r["op"] for r in changes(json_documents(text))] == ["replace"]
    assert [(r["op"], r["name"]) for r in changes(json_documents(PLAN))] == [("delete", "kimi-node1-ssh")]


def test_the_upgrade_verdict_tells_a_replaced_vm_from_a_step_that_runs_again():
    steps: list[dict] = [{"op": "same", "urn": URN.format("VirtualMachine", "kimi-node0")},
                         {"op": "replace", "urn": URN.format("VirtualMachine", "kimi-node1"),
                          "diffReasons": ["user_data"]},
                         {"op": "update", "urn": "urn:pulumi:sandbox::kimi-cluster::command:remote:Command::"
                                                 "kimi-node0-launch"},
                         {"op": "create", "urn": URN.format("SecurityRule", "kimi-node1-ssh")}]
    found = verdict(steps)
    assert found["replaced"] == ["hyperstack:VirtualMachine kimi-node1 (replace: user_data)",
                                 "hyperstack:SecurityRule kimi-node1-ssh (create)"]
    assert found["updated"] == ["command:remote:Command kimi-node0-launch (update)"] and found["other"] == []


def test_status_advises_on_a_stopped_vm_with_what_it_still_bills():
    nodes = [{"name": "kimi-node1", "vm": {"status": "SHUTOFF"}, "probe": {}}]
    line = advice(nodes, {}, 20.8)
    assert line and "SHUTOFF" in line and "STILL BILLS $20.80/h" in line and "replaces it" in line
