"""A VM that goes to ERROR in the emulator fails `up` with the cloud's reason and leaves no VM billing."""

from __future__ import annotations

import time

import pytest

from .conftest import EMPTY, leftover_processes, ok, report

pytestmark = [pytest.mark.flow, pytest.mark.timeout(300)]


def test_vm_in_error_fails_up_with_the_reason_and_leaves_no_vm(sandbox, start_emulator) -> None:
    emulator = start_emulator("vm-error:kimi-sandbox-node0")
    run = sandbox(emulator.env())
    started = time.monotonic()

    up = run("up", "--topology", "b300x1-vllm")
    assert up.code == 1, up.output
    assert "went to ERROR" in up.output
    assert "No valid host was found" in up.output  # the emulator's event text, carried to the user
    assert "was deleted, nothing is left billing" in up.output
    assert "sandbox up: failed" in up.output
    assert emulator.inventory()["virtual_machines"] == []
    assert emulator.vm_posts() == 1

    ok(run("destroy", "--quiet"))
    assert emulator.inventory() == EMPTY
    assert leftover_processes(run.workdir) == []
    report(f"b300x1-vllm with its VM going to ERROR: failed up {up.seconds:.1f} s, "
           f"whole test {time.monotonic() - started:.1f} s")
