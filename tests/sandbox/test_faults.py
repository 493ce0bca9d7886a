"""A VM that goes to ERROR in the emulator fails `up` with the cloud's reason and leaves no VM billing; a 429 storm
on the API is ridden out by the providers' retries."""

from __future__ import annotations

import time

import pytest

from .conftest import leftover_processes, ok, report

pytestmark = [pytest.mark.flow, pytest.mark.timeout(300)]


def test_vm_in_error_fails_up_with_the_reason_and_leaves_no_vm(sandbox) -> None:
    run = sandbox(emulator_args="--fault vm-error:kimi-sandbox-node0")
    started = time.monotonic()

    up = run("up", "--topology", "b300x1-vllm")
    assert up.code == 1, up.output
    assert "went to ERROR" in up.output
    assert "No valid host was found" in up.output  # the emulator's event text, carried to the user
    assert "was deleted, nothing is left billing" in up.output
    assert "sandbox up: failed" in up.output
    emulator = run.emulator()
    assert emulator.inventory()["virtual_machines"] == []
    assert emulator.vm_posts() == 1
    assert not [r for r in run.resources() if r["type"].endswith(":VirtualMachine")]

    destroy = ok(run("destroy", "--quiet"))
    assert "emulator: nothing left" in destroy, destroy
    assert leftover_processes(run.workdir) == []
    report(f"b300x1-vllm with its VM going to ERROR: failed up {up.seconds:.1f} s, "
           f"whole test {time.monotonic() - started:.1f} s")
