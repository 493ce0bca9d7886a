"""An `up` killed partway (the engine's whole process group, as a crash or a closed laptop would): the next up resumes
without a second VM, and a destroy instead of it leaves nothing, not even a VM whose create was never recorded.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from fakes import sandbox_services as services

from .conftest import EMPTY, leftover_processes, ok, report, wait_for

pytestmark = [pytest.mark.flow, pytest.mark.timeout(420)]


def _kill_engine(run, driver) -> int:
    """SIGKILL the engine's process group (it runs in its own session); the driver then reports the interruption."""
    pid = int(wait_for("the engine's pid file", lambda: (run.workdir / "engine.pid").exists()
                       and (run.workdir / "engine.pid").read_text().strip(), 30))
    os.killpg(pid, signal.SIGKILL)
    output, _ = driver.communicate(timeout=60)
    assert driver.returncode != 0, output
    assert "the engine ended with exit code -9 and no result" in output, output
    assert "sandbox up: stopped after" in output, output
    wait_for(f"engine pid {pid} to end", lambda: not services._alive(pid), 10)
    return pid


def test_killed_up_resumes_without_a_second_vm(sandbox, start_emulator) -> None:
    emulator = start_emulator()
    run = sandbox(emulator.env())
    started = time.monotonic()
    driver = run.start("up", "--topology", "h100x4-sglang", "--quiet")
    # Killed while the VMs exist but are still being waited for: the state holds no VM yet, the emulator four.
    wait_for("four VMs in the emulator", lambda: len(emulator.inventory()["virtual_machines"]) == 4, 90)
    _kill_engine(run, driver)
    assert emulator.vm_posts() == 4

    resumed = run("up")
    out = ok(resumed)
    assert "adopting VM" in out and "interrupted during create" in out
    assert emulator.vm_posts() == 4
    inventory = emulator.inventory()
    assert sorted(vm["name"] for vm in inventory["virtual_machines"]) == [f"kimi-sandbox-node{r}" for r in range(4)]

    ok(run("verify"))
    ok(run("destroy", "--quiet"))
    assert emulator.inventory() == EMPTY
    assert leftover_processes(run.workdir) == []
    report(f"h100x4-sglang killed after its VMs existed: resumed up {resumed.seconds:.1f} s, "
           f"whole test {time.monotonic() - started:.1f} s")


def test_destroy_after_a_killed_up_leaves_nothing(sandbox, start_emulator) -> None:
    # The VM never leaves BUILD, so the engine is surely killed before it recorded the VM: only the emulator knows.
    emulator = start_emulator("stuck-in-build:kimi-sandbox-node0")
    run = sandbox(emulator.env())
    started = time.monotonic()
    driver = run.start("up", "--topology", "b300x1-vllm", "--quiet")
    wait_for("the VM in BUILD", lambda: [vm for vm in emulator.inventory()["virtual_machines"]
                                         if vm["status"] == "BUILD"], 60)
    _kill_engine(run, driver)

    destroy = run("destroy")
    out = ok(destroy)
    assert "an interrupted up created it but never recorded it" in out
    assert emulator.inventory() == EMPTY
    assert leftover_processes(run.workdir) == []
    report(f"b300x1-vllm killed during VM creation, then destroyed: destroy {destroy.seconds:.1f} s, "
           f"whole test {time.monotonic() - started:.1f} s")
