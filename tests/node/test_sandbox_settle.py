"""The sandbox's short settle check (kimi-cluster:nodeTiming in Pulumi.sandbox.yaml) still catches an engine that
dies at start-up: the launch step, rendered with the sandbox stack's own settings, against a fake node whose docker
stub starts the sandbox's real fake engine (kimi_cluster/fakes/node/engine_hook.py), as `sandbox up` runs it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from kimi_cluster.blueprint import render_step
from kimi_cluster.fakes.node import BIN, make_fake_node
from kimi_cluster.sandbox.nodes import ENGINE_HOOK, stack_settings
from tests.node.conftest import REVISION

pytestmark = pytest.mark.integration  # starts fake nodes, servers or outside tools


@pytest.fixture
def hooked_node(tmp_path: Path):
    node = make_fake_node(tmp_path, run_hook=str(ENGINE_HOOK),
                          extra_env={"PATH": f"{BIN}:{Path(sys.executable).parent}:/usr/bin:/bin"})
    (node.root / f"ephemeral/hf/hub/models--moonshotai--Kimi-K3.1-Pro/snapshots/{REVISION}").mkdir(parents=True)
    yield node
    node.cleanup()


def _launch(node, extra_args: list[str]):
    settings = stack_settings("b300x1-vllm", {"nodeRoot": str(node.root), "extraEngineArgs": json.dumps(extra_args)})
    assert settings.timing.settle_seconds < 15  # the sandbox's own, shorter than a real VM's
    script = render_step(settings, "launch", 0, "127.0.0.1", "127.0.0.1")
    assert f"sleep {settings.timing.settle_seconds:g}\n" in script
    return node.run(script)


def test_an_engine_dying_at_start_up_fails_the_sandbox_launch(hooked_node):
    # The fake engine's parser refuses this value at once, as a real engine refuses a bad flag.
    result = _launch(hooked_node, ["--slow-seconds", "not-a-number"])
    out = result.stdout + result.stderr
    assert result.returncode != 0, out
    assert "the engine exited at start-up" in out, out


def test_a_healthy_engine_passes_the_sandbox_launch(hooked_node):
    result = _launch(hooked_node, [])
    assert result.returncode == 0, result.stdout + result.stderr
    assert hooked_node.container("kimi-engine")["status"] == "running"
