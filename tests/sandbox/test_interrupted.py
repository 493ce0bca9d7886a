"""An interrupted `pulumi up`, and the recovery a user runs (docs/operations.md, "Recovering from an interrupted up"):

- Ctrl-C (SIGINT to the sandbox, which hands it to `pulumi`): the CLI stops starting new steps, finishes or cancels
  the ones under way and saves its checkpoint; the next up carries on, with no second VM.
- `pulumi` killed outright (SIGKILL: a crash), its provider hosts living on, or with its whole session (a closed
  laptop): the checkpoint keeps the creates it had begun as pending operations and the stack stays locked; the next up
  runs `pulumi cancel`, `pulumi refresh --clear-pending-creates`, then `pulumi up`, whose VM
  provider adopts each VM a lost create made, by name. A provider host that outlived pulumi must not delete the VM
  it was waiting for (kimi_cluster/deploy/hyperstack_providers/progress.py): that would cost a second VM.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from kimi_cluster.fakes import sandbox_services as services
from kimi_cluster.fakes.node_fabric import Fabric, FabricConfig
from kimi_cluster.sandbox.pulumi_cli import end_session

from .conftest import leftover_processes, ok, report, wait_for

pytestmark = [pytest.mark.flow, pytest.mark.timeout(600)]
NODES = [f"kimi-sandbox-node{r}" for r in range(4)]


def _vms(run) -> list[str]:
    try:
        return sorted(vm["name"] for vm in run.emulator().inventory()["virtual_machines"])
    except (OSError, KeyError, ValueError):
        return []  # the emulator is not up yet


def _pulumi_pid(run) -> int:
    pid_file = run.workdir / "pulumi.pid"
    return int(wait_for("pulumi's pid file", lambda: pid_file.exists() and pid_file.read_text().strip(), 60))


@pytest.mark.parametrize("how", ["sigint", "sigkill", "killpg"])
def test_an_interrupted_up_resumes_with_no_second_vm_and_destroys_clean(sandbox, how: str) -> None:
    run = sandbox()
    started = time.monotonic()
    driver = run.start("up", "--topology", "h100x4-sglang", "--quiet")
    wait_for("four VMs in the emulator", lambda: _vms(run) == NODES, 120)
    pid = _pulumi_pid(run)
    if how == "sigint":
        os.kill(driver.pid, signal.SIGINT)  # the user's Ctrl-C reaches the sandbox, which passes it to pulumi
    elif how == "sigkill":
        os.kill(pid, signal.SIGKILL)
    else:
        for victim in end_session(pid):  # pulumi and its plugins: the whole session the sandbox started it in
            wait_for(f"pid {victim} to end", lambda v=victim: not services.is_alive(v), 10)
    output, _ = driver.communicate(timeout=300)
    assert driver.returncode != 0, output
    wait_for(f"pulumi (pid {pid}) to end", lambda: not services.is_alive(pid), 30)
    assert end_session(pid) == [], "pulumi's plugins outlived the sandbox's up"
    if how == "sigint":
        assert "sandbox up: stopped after" in output, output

    resumed = run("up")
    out = ok(resumed)
    if how != "sigint":
        assert "pulumi refresh --clear-pending-creates" in out, out
    assert run.emulator().vm_posts() == 4, out
    assert _vms(run) == NODES

    ok(run("verify"))
    destroy = run("destroy", "--quiet")
    assert "emulator: nothing left" in ok(destroy)
    assert leftover_processes(run.workdir) == []
    report(f"h100x4-sglang up interrupted by {how} once its VMs existed: resumed up {resumed.seconds:.1f} s, "
           f"whole test {time.monotonic() - started:.1f} s")


def test_destroy_after_a_killed_up_leaves_nothing(sandbox) -> None:
    # The VM never leaves BUILD, so pulumi is surely killed before it recorded the VM: only the emulator knows it.
    run = sandbox(emulator_args="--fault stuck-in-build:kimi-sandbox-node0")
    started = time.monotonic()
    driver = run.start("up", "--topology", "b300x1-vllm", "--quiet")
    wait_for("the VM in BUILD", lambda: [vm for vm in run.emulator().inventory()["virtual_machines"]
                                         if vm["status"] == "BUILD"]
             if (run.workdir / "sandbox.json").exists() and "emulator_url" in run.record() else [], 120)
    pid = _pulumi_pid(run)
    end_session(pid)
    driver.communicate(timeout=120)
    assert driver.returncode != 0

    destroy = run("destroy")
    out = ok(destroy)
    assert "an interrupted up created it but never recorded it" in out, out
    assert "emulator: nothing left" in out, out
    assert leftover_processes(run.workdir) == []
    report(f"b300x1-vllm killed during VM creation, then destroyed: destroy {destroy.seconds:.1f} s, "
           f"whole test {time.monotonic() - started:.1f} s")


def test_destroy_after_the_sandbox_itself_was_killed_leaves_no_process_namespace_or_bridge(sandbox) -> None:
    """Issue 44: a `sandbox up` killed outright (SIGKILL, a `timeout` gone wrong) left its Pulumi plugins running even
    after `sandbox destroy`: their command lines name no workdir, their PULUMI_HOME does."""
    run = sandbox()
    driver = run.start("up", "--topology", "b300x1-vllm", "--quiet")
    wait_for("the VM in the emulator", lambda: _vms(run) == ["kimi-sandbox-node0"], 120)
    pid = _pulumi_pid(run)
    wait_for("pulumi's plugins", lambda: len(services.processes_with_env("PULUMI_HOME", run.workdir)) > 1, 60)
    driver.kill()
    driver.wait(timeout=30)
    wait_for(f"pulumi (pid {pid}) to end", lambda: not services.is_alive(pid), 120)
    fabric = Fabric(FabricConfig.load(run.workdir / "fabric.json"))
    destroy = run("destroy", "--quiet")
    ok(destroy)
    assert leftover_processes(run.workdir) == []
    assert fabric.namespaces() == [] and not fabric.bridge_up()
    report(f"b300x1-vllm whose sandbox up was SIGKILLed mid-up, then destroyed: destroy {destroy.seconds:.1f} s")
