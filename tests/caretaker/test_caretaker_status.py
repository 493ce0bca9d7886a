"""`status`'s caretaker lines from a state file as a node could write it, hostile shapes included."""

from __future__ import annotations

import json

import pytest

from kimi_cluster.operator.caretaker_status import caretaker_view, checked_state, format_caretaker
from kimi_cluster.operator.stack_state import Connection, NodeRecord, StackState
from kimi_cluster.settings.loader import load_settings

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGtpbWktY2x1c3Rlci10ZXN0LWtleS1ub3QtcmVhbCEh t"


class Runner:
    def __init__(self, code: int, out: str) -> None:
        self.code, self.out = code, out
        self.commands: list[str] = []

    def run(self, connection, command, stdin, timeout):
        self.commands.append(command)
        return self.code, self.out, "denied" if self.code else ""


def _state() -> StackState:
    node = NodeRecord(0, "kimi-dev-node0", "1000", "198.51.100.10", "10.0.0.10",
                      Connection("198.51.100.10", "ubuntu", "k", "ssh-ed25519 AAA"))
    return StackState("dev", {"caretaker_vm": "kimi-dev-node0"}, [node])


def _settings(**extra):
    return load_settings({"operatorCidr": "81.2.69.1/32", "sshPublicKey": KEY, "topology": "b300x1-vllm",
                          "caretakerApiKey": True, **extra}, "dev")


def test_idle_spend_and_what_it_did():
    state = {"idle_minutes": 12.5, "requests": 1234, "spend_usd": 410.0, "spend_source": "billing history",
             "served_since": 1.0, "warning": "budget 82% spent", "action": None,
             "history": [{"reason": "idle", "why": "no request for 60 minutes", "started_at": "2026-12-03T10:00:00Z",
                          "done_at": "2026-12-03T10:00:04Z", "deleted": ["kimi-dev-node0"]}]}
    runner = Runner(0, json.dumps(state))
    view = caretaker_view(_state(), _settings(idleStopMinutes="60", budgetUsd="500"), runner)
    assert view is not None and "var/lib/kimi-cluster/caretaker/state.json" in runner.commands[0]
    text = "\n".join(format_caretaker(view))
    assert "caretaker on kimi-dev-node0: idle 12.5 of 60 min, 1,234 requests counted" in text
    assert "spent $410.00 of $500.00 (82 %, billing history)" in text and "WARNING: budget 82% spent" in text
    assert "last stop (idle) at 2026-12-03T10:00:00Z, done 2026-12-03T10:00:04Z: no request for 60 minutes; " \
           "deleted kimi-dev-node0" in text


def test_off_unreadable_or_gone():
    assert caretaker_view(_state(), _settings(), Runner(0, "{}")) is None
    view = caretaker_view(_state(), _settings(idleStopMinutes="60"), Runner(1, ""))
    assert view and "cannot read its state on kimi-dev-node0 (exit 1): denied" in format_caretaker(view)[0]
    gone = StackState("dev", {"caretaker_vm": "kimi-dev-node0"}, [])
    view = caretaker_view(gone, _settings(idleStopMinutes="60"), Runner(0, "{}"))
    assert view and "pulumi up" in format_caretaker(view)[0]


@pytest.mark.parametrize("raw", [[], "x", {"requests": "many", "spend_usd": float("inf"), "history": "no",
                                            "action": {"deleted": "all", "why": 5}}])
def test_hostile_state_files_are_checked_field_by_field(raw):
    if not isinstance(raw, dict):
        with pytest.raises(ValueError):
            checked_state(raw)
        return
    view = checked_state(raw)
    assert view["requests"] is None and view["spend_usd"] is None and view["last_action"] is None
    assert view["action"] == {"reason": None, "why": None, "started_at": None, "done_at": None, "deleted": []}
