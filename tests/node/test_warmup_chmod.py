"""Issue 44, security 3: the TokenSpeed warm-up ran `chmod -R a+rwX` on the cache as root before it removed an earlier
warm-up container, which runs the engine's image with that cache mounted read-write and is left running whenever its
step did not reach its own removal; a link it raced into the tree during the chmod made any host file 0666. A chmod on
PATH ahead of the real one records which containers run when it is called."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests.node.conftest import FAST, REVISION, chmod_spy
from tests.node.test_steps_on_fake_node import ok, scripts_for

pytestmark = pytest.mark.integration

IMAGE = "lightseekorg/tokenspeed:0.1.1@sha256:" + "ab" * 32


def test_the_warmups_recursive_chmod_runs_only_once_an_earlier_warmup_container_is_gone(node, tmp_path):
    snapshot = node.root / f"ephemeral/hf/hub/models--moonshotai--Kimi-K3.1-Pro/snapshots/{REVISION}"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    record = node.root / f"ephemeral/kimi/verified/{REVISION}.json"  # the check step's record: the weights are there
    record.parent.mkdir(parents=True)
    record.write_text("{}")
    # The earlier warm-up, still running with the cache mounted.
    ok(node.run("docker run -d --name kimi-warmup --restart no lightseekorg/tokenspeed:0.1.1 serve >/dev/null"))
    assert node.container("kimi-warmup")["status"] == "running"
    spy, seen = chmod_spy(tmp_path, "kimi-warmup")
    scripts = scripts_for(node, "b300x1-tokenspeed", image=IMAGE, kernelWarmup=True,
                          timing=replace(FAST, warmup_timeout_s=1))
    assert 'chmod -R a+rwX "$CACHE"' in scripts["warmup"]
    out = ok(node.run(scripts["warmup"], PATH=f"{spy}:{node.env['PATH']}"))
    assert seen.exists(), out
    assert seen.read_text() == "chmod\n", "chmod -R ran while a warm-up container was running"
