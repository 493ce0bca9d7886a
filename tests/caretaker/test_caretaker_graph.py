"""The caretaker in the program's graph, under Pulumi's mocks: its one step on the endpoint's VM (the head, or the
front with replicas) after the readiness wait, its key on stdin only, the outputs, and `up` refusing a budget it
cannot read.
"""

from __future__ import annotations

import base64
import json
import re

import pytest

from tests.deploy.test_program import config
from tests.deploy.test_replicas import outputs_for  # the front's address too
from tests.pulumi_harness import Recording, run_program

CANARY_CARETAKER = "caretaker-canary-key-3e9f"


def _run(**extra: str) -> Recording:
    cfg, secret = config(caretakerApiKey=CANARY_CARETAKER, **extra)
    return run_program(cfg, [*secret, "kimi-cluster:caretakerApiKey"], outputs_for)


def _everywhere_but_stdin(rec: Recording) -> str:
    return json.dumps([{k: v for k, v in r.plain().items() if k != "stdin"} for r in rec.resources]) \
        + json.dumps(rec.exports)


def test_one_replica_runs_it_on_the_head_once_the_endpoint_is_ready():
    rec = _run(topology="b300x1-vllm", idleStopMinutes="30")
    step = rec.by_name["kimi-caretaker"]
    assert step.values()["connection"]["host"] == "198.51.100.10"  # the head
    assert any(d.endswith("kimi-node0-proxy") for d in step.deps), step.deps
    assert any(d.endswith("kimi-ready-wait") for d in step.deps), step.deps
    assert step.values()["stdin"] == CANARY_CARETAKER + "\n" and "stdin" in step.secret_paths()
    script = step.script()
    assert "# The GPU VMs this arming is for: 1000" in script and CANARY_CARETAKER not in script
    assert CANARY_CARETAKER not in _everywhere_but_stdin(rec)
    assert rec.exports["idle_stop_minutes"] == 30 and rec.exports["budget_usd"] is None
    assert rec.exports["caretaker_vm"] == "kimi-dev-node0"
    # The proxy logs for it and answers its 503.
    proxy = rec.by_name["kimi-node0-proxy"].script()
    assert 'install -d -m 0700 "$PROXY_DIR/caretaker"' in proxy
    found = re.search(r"printf %s '?([A-Za-z0-9+/=]+)'? \| base64 -d \| put \"\$PROXY_DIR/Caddyfile", proxy)
    assert found
    caddyfile = base64.b64decode(found.group(1)).decode()
    assert "caretaker/stopped.json" in caddyfile and "caretaker/access.log" in caddyfile


def test_with_replicas_it_runs_on_the_front_and_names_every_gpu_vm():
    rec = _run(topology="b300x1-vllm", replicas="2", idleStopMinutes="60")
    step = rec.by_name["kimi-caretaker"]
    assert any(d.endswith("kimi-front-proxy") for d in step.deps), step.deps
    assert any(d.endswith("kimi-front-ready-wait") for d in step.deps), step.deps
    told = json.loads(base64.b64decode(re.search(r'b64decode\("([A-Za-z0-9+/=]+)"\)', step.script()).group(1)))
    assert told["gpu_vms"] == ["kimi-dev-node0", "kimi-dev-r1-node0"] and told["self_name"] == "kimi-dev-front"
    assert "# The GPU VMs this arming is for: 1000 1100" in step.script()
    assert step.values()["connection"]["host"] == "198.51.100.200"  # the front
    assert len(rec.of_type("command:remote:Command")) > 0 and rec.exports["caretaker_vm"] == "kimi-dev-front"


def test_off_by_default_nothing_of_it():
    cfg, secret = config(topology="b300x1-vllm")
    rec = run_program(cfg, secret, outputs_for)
    assert "kimi-caretaker" not in rec.by_name and "idle_stop_minutes" not in rec.exports


def test_a_budget_whose_spend_cannot_be_read_is_refused_before_any_resource():
    rec = Recording()
    cfg, secret = config(topology="b300x1-vllm", budgetUsd="500", caretakerApiKey=CANARY_CARETAKER)
    with pytest.raises(Exception, match="kimi-cluster:budgetUsd is set, but what the stack has spent could not"):
        run_program(cfg, [*secret, "kimi-cluster:caretakerApiKey"], outputs_for, recording=rec)
    assert rec.resources == []


def test_a_guard_without_its_key_is_refused_naming_it():
    rec = Recording()
    cfg, secret = config(topology="b300x1-vllm", idleStopMinutes="30")
    with pytest.raises(Exception, match="kimi-cluster:caretakerApiKey is required with kimi-cluster:idleStopMinutes"):
        run_program(cfg, secret, outputs_for, recording=rec)
    assert rec.resources == []
