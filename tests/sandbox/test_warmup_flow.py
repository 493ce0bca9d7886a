"""The kernel warm-up (kimi-cluster:kernelWarmup) under the real CLI: it compiles the kernels on random weights while
the fake download runs, and the launch finds them; SGLang's ranks run its compile tool together and the head's step
waits for the group; a warm-up that does not finish in time hands the GPUs back, and the launch starts cold and still
serves. No kernel cache here: everything the launch finds, the warm-up compiled.
"""

from __future__ import annotations

import io
import json
import os
import signal
import time

import pytest

from kimi_cluster.fakes.hub import RELEASE_PATH
from kimi_cluster.operator.timeline_report import bars_from_state
from kimi_cluster.plan.warmup import RESULT_FILE
from kimi_cluster.sandbox.nodes import COMPILE_SECONDS_KNOB

from .conftest import COMMAND_TIMEOUT_S, Result, engine_log, hub_stats, leftover_processes, ok, report, wait_for

pytestmark = [pytest.mark.flow, pytest.mark.timeout(900)]

COMPILE_SECONDS = 10
COMPILING = {COMPILE_SECONDS_KNOB: str(COMPILE_SECONDS)}
# The hub holds every shard's body at its middle (kimi_cluster/fakes/hub_hold.py) and lets config.json and the
# tokenizer through, which the warm-up reads: the download is under way for as long as the warm-up takes, and
# up_beside_a_held_download releases it once the warm-up has its outcome. A condition, where a throttled hub's rate
# was a guess at how long a loaded machine compiles.
HOLD_SHARDS = "--hold *.safetensors"


def warm_up_outcomes(workdir) -> list[str]:
    """Each node's warm-up outcome so far (kimi_cluster/plan/warmup.py RESULT_FILE): done, skipped, started, failed."""
    return [p.read_text().split(" ", 1)[0] for p in workdir.glob(f"nodes/*/var/lib/kimi-cluster/{RESULT_FILE}")]


def up_beside_a_held_download(run, *args: str) -> Result:
    """`up` in the background; once the head's warm-up is done or has failed while a shard is still held mid-body,
    the hub's release; then the up's end."""
    log = run.workdir.parent / f"{run.workdir.name}-up.log"
    started = time.monotonic()
    with log.open("w") as output:
        driver = run.start("up", *args, output=output)
        try:
            wait_for("the warm-up's outcome while the download is held", lambda: (run.workdir / "sandbox.json").exists()
                     and {"done", "failed"} & set(warm_up_outcomes(run.workdir))
                     and hub_stats(run.workdir)["held"] > 0, COMMAND_TIMEOUT_S, interval=0.5)
            assert hub_stats(run.workdir, RELEASE_PATH) == {"holding": False}
            driver.wait(timeout=COMMAND_TIMEOUT_S)
        finally:
            if driver.poll() is None:
                os.killpg(driver.pid, signal.SIGKILL)
    return Result(driver.returncode, log.read_text(), time.monotonic() - started)


def warmup_log(workdir) -> str:
    return "".join(p.read_text() for p in workdir.glob("nodes/*/var/lib/fake-node/docker/containers/kimi-warmup.log"))


def containers(run, name: str) -> list[str]:
    """Every node's containers of that name, running or not, as the fake docker keeps them."""
    return [str(p) for p in run.workdir.glob(f"nodes/*/var/lib/fake-node/docker/containers/{name}.json")]


def marks(run) -> dict[tuple[int, str], tuple[float, float]]:
    """(rank, step) -> (start, end) in seconds, from the steps' KIMI-STEP marks in the stack's export."""
    from kimi_cluster.sandbox.kimi import Sandbox

    with Sandbox(run.workdir, out=io.StringIO()).state_document() as path:
        bars = bars_from_state(json.loads(path.read_text()))
    return {(b.rank, b.step): (b.start.timestamp(), b.end.timestamp() if b.end else float("nan")) for b in bars}


def test_the_warm_up_compiles_beside_the_download_and_one_that_times_out_falls_back_to_a_cold_launch(sandbox):
    run = sandbox(env=COMPILING, hub_args=HOLD_SHARDS)
    warmed = up_beside_a_held_download(run, "--topology", "b300x1-vllm", "--config", "kernelWarmup=true")
    ok(warmed)
    warmup = run.step_output("kimi-node0-warmup")
    assert "warming up from its shapes" in warmup and "kernel warm-up done in" in warmup, warmup
    assert f"compiling 6 of 6 kernels ({COMPILE_SECONDS:.1f} s; the cache had 0) on random weights" in \
        warmup_log(run.workdir)
    # The launch found what the warm-up compiled, and said so.
    assert "the engine finds its kernels compiled" in run.step_output("kimi-node0-launch")
    log = engine_log(run.workdir)
    assert "all 6 kernels found in the cache; no compile" in log and "compiling" not in log
    # Beside the download: the warm-up had its outcome while a shard was held mid-body (up_beside_a_held_download
    # waited on that), and its step started before the weights step ended.
    steps = marks(run)
    assert steps[(0, "warmup")][0] < steps[(0, "weights")][1], steps
    assert containers(run, "kimi-warmup") == []  # removed, its GPUs handed back
    ok(run("destroy"))

    # A warm-up that cannot finish in its time: a WARNING, the GPUs handed back, a cold launch that still serves.
    timing = json.dumps({"warmupTimeoutS": 3})
    cold = up_beside_a_held_download(run, "--topology", "b300x1-vllm", "--config", "kernelWarmup=true", "--config",
                                     f"nodeTiming={timing}")
    out = ok(cold)
    warmup = run.step_output("kimi-node0-warmup")
    assert "WARNING: kernel warm-up:" in warmup and "the launch starts cold" in warmup, warmup
    launch = run.step_output("kimi-node0-launch")
    assert "WARNING: kernel warm-up failed" in launch and "this is a cold launch" in launch, launch
    assert "compiling 6 of 6 kernels" in engine_log(run.workdir)  # the warm-up left nothing half-built
    assert containers(run, "kimi-warmup") == []
    assert "endpoint_url" in out
    ok(run("destroy"))
    assert leftover_processes(run.workdir) == []
    report(f"b300x1-vllm kernel warm-up: up with the warm-up {warmed.seconds:.1f} s, up after a warm-up that timed "
           f"out {cold.seconds:.1f} s (fake compile {COMPILE_SECONDS} s, the download held until the warm-up's end)")


def test_sglangs_ranks_run_the_compile_tool_together_and_the_head_waits_for_the_group(sandbox):
    run = sandbox(env=COMPILING, hub_args=HOLD_SHARDS)
    up = up_beside_a_held_download(run, "--topology", "h100x4-sglang", "--config", "kernelWarmup=true")
    ok(up)
    head = run.step_output("kimi-node0-warmup")
    assert "kernel warm-up done in" in head, head
    for rank in (1, 2, 3):
        assert "the head's warm-up step waits for the whole group" in run.step_output(f"kimi-node{rank}-warmup")
        # Its launch (after the head's) removed the container, which had ended by itself.
        launch = run.step_output(f"kimi-node{rank}-launch")
        assert "removing the kernel warm-up's container" in launch and "joined the head's warm-up" in launch, launch
    # Every rank ran SGLang's compile tool (the fake engine's --compile-only), which exits by itself.
    log = warmup_log(run.workdir)
    assert log.count("kernels compiled; exiting (compile only)") == 4, log
    assert "all 5 kernels found in the cache; no compile" in engine_log(run.workdir)
    assert "compiling" not in engine_log(run.workdir)
    assert containers(run, "kimi-warmup") == []
    ok(run("destroy"))
    assert leftover_processes(run.workdir) == []
    report(f"h100x4-sglang kernel warm-up: up {up.seconds:.1f} s (fake compile {COMPILE_SECONDS} s on each rank)")
