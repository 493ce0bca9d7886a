"""A running cluster survives its own upgrade: a sandbox stack brought up by the previous release (a git worktree
of its commit, named in docs/CHANGELOG.md, with its own virtualenv) is upgraded by `up` with the working tree on the
same workdir and state. The CLI's own preview (`pulumi preview --diff --json`) proves that no VM, keypair,
environment, rule, certificate, host key or generated secret is replaced, created or deleted, and that no node step
runs again but those the changelog's entry for this release names ("Steps that run again:"); the up itself creates,
replaces and deletes nothing, and `verify` passes. A change that would replace a VM fails this test on its own:
its changelog entry must then say so, and this test must be told to expect it.
"""

from __future__ import annotations

import io
import re
import threading
from collections.abc import Sequence
from pathlib import Path

import pytest

from kimi_cluster.release import VERSION_OUTPUT, __version__
from kimi_cluster.sandbox import releases

from .conftest import NOT_COMPILING, leftover_processes, ok, report, wait_for

pytestmark = [pytest.mark.flow, pytest.mark.timeout(2400)]
CHANGELOG = (Path(__file__).resolve().parents[2] / "docs" / "CHANGELOG.md").read_text()
# What this release's changelog entry says an up runs again, or adds, on each flow's stack: the 4-node stack sets no
# key that adds more (no kernelCache, kernelWarmup or guard); the replicas' stack sets `replicas`.
RUN_AGAIN = releases.steps_run_again(CHANGELOG, __version__)
REPLICAS_RUN_AGAIN = releases.steps_run_again(CHANGELOG, __version__, keys=("replicas",))
REPLICAS_ADDED = releases.steps_added(CHANGELOG, __version__, keys=("replicas",))
# The longest the previous release's resuming layer may leave the front without a layer while this up restarts it:
# its exit (it polls for shutdown every 0.5 s) and the new one's start (a Python start on a loaded 2-core machine).
RESTART_WINDOW_S = 10.0


def _previous_release() -> Path:
    """The previous release's checkout; a clone without its commit (a shallow one) cannot prove the upgrade, and
    says how to get it rather than fail on a missing source."""
    try:
        return releases.release_checkout(releases.PREVIOUS_RELEASE)
    except releases.ReleaseError as err:
        if "not in this clone's history" in str(err):
            pytest.skip(str(err))
        raise


def _no_change_but_the_named_steps(summary_text: str, updated: Sequence[str], created: Sequence[str] = ()) -> None:
    """The up's own summary: nothing replaced or deleted; as many updated, and created, as the preview's named
    steps."""
    assert not re.search(r"replaced|deleted", summary_text), summary_text
    for word, named in (("updated", updated), ("created", created)):
        count = re.search(rf"(\d+) {word}", summary_text)
        assert (int(count.group(1)) if count else 0) == len(named), (summary_text, word, named)


def test_a_stack_of_the_previous_release_upgrades_with_nothing_replaced(sandbox) -> None:
    old = _previous_release()
    run = sandbox()
    first = releases.sandbox_command(old, run.workdir, "up", "--topology", "h100x4-sglang", "--no-timeline",
                                     "--no-kernel-cache", "--quiet", env=NOT_COMPILING)
    assert first.returncode == 0, first.stdout[-4000:]
    deployed = run.outputs()[VERSION_OUTPUT]
    assert deployed != __version__
    assert f"deployed by kimi-cluster {deployed}; this checkout is {__version__}" in ok(run("status"))

    plan = releases.preview_upgrade(run.workdir, io.StringIO())
    found = releases.verdict(plan["steps"])
    summary = plan.get("changeSummary") or {}
    report(f"upgrade {releases.PREVIOUS_RELEASE} -> {__version__}: the preview's changeSummary {summary}; "
           f"replaced {len(found['replaced'])}, updated {len(found['updated'])}, other {len(found['other'])}")
    assert found["replaced"] == [], releases.describe(found)
    # Every resource of the 4-node stack is the same but the steps the changelog names (the stack's outputs change:
    # a new one, a fresh price's time).
    assert set(summary) <= {"same", "update"} and summary["same"] >= 40, summary
    assert releases.unexpected_updates(found["updated"], RUN_AGAIN) == [], releases.describe(found)
    assert found["other"] == [], releases.describe(found)

    upgraded = ok(run("up"))
    _no_change_but_the_named_steps(upgraded[upgraded.rindex("Resources:"):].split("Duration:")[0], found["updated"])
    assert run.outputs()[VERSION_OUTPUT] == __version__
    assert "release:" not in ok(run("status"))
    assert "no changes" in ok(run("refresh", "--expect-no-changes"))
    assert "no changes" in ok(run("up", "--expect-no-changes"))
    ok(run("verify"))
    # The upgrade's up recorded each rule's deletedWith (an option: no step, but the state takes it), so the
    # upgraded stack's destroy makes no call per rule either.
    rules = [r for r in run.resources() if r["type"].endswith("hyperstack:SecurityRule")]
    with_vm = [r for r in rules if r.get("deletedWith")]
    report(f"upgraded stack: {len(with_vm)} of {len(rules)} rules record deletedWith")
    assert rules and len(with_vm) == len(rules), rules[0]
    ok(run("destroy"))
    assert leftover_processes(run.workdir) == []


def test_two_replicas_behind_a_front_upgrade_with_no_failed_request(sandbox, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same upgrade under traffic: two b300x1-vllm replicas behind the front, chats and streams through it for
    the whole `up` with the working tree; nothing is replaced, and only the previous release's resuming layer, which
    this up restarts, ends what it carries at that moment (bounded below)."""
    from benchmarks._replicas_load import Tally, run_load

    monkeypatch.setenv("FAKE_ENGINE_TOKEN_SECONDS", "0.02")  # answers in about a second: many during the up
    old = _previous_release()
    run = sandbox()
    first = releases.sandbox_command(old, run.workdir, "up", "--topology", "b300x1-vllm", "--config", "replicas=2",
                                     "--no-timeline", "--no-kernel-cache", "--quiet", env=NOT_COMPILING)
    assert first.returncode == 0, first.stdout[-4000:]
    found = releases.verdict(releases.preview_upgrade(run.workdir, io.StringIO())["steps"])
    assert found["replaced"] == [], releases.describe(found)
    assert releases.unexpected_updates(found["updated"], REPLICAS_RUN_AGAIN) == [], releases.describe(found)
    assert releases.unexpected_others(found["other"], REPLICAS_ADDED) == [], releases.describe(found)

    outputs = run.outputs()
    ca = run.workdir / "upgrade-ca.pem"
    ca.write_text(outputs["ca_certificate"])
    tally, stop = Tally(), threading.Event()
    threads = run_load(outputs["openai_base_url"], outputs["api_key"], str(ca), outputs["served_model_name"], 4,
                       stop, tally)
    try:
        assert wait_for("a request through the front", lambda: tally.requests >= 4, 60)
        before = tally.requests
        upgraded = ok(run("up"))
        during = tally.requests - before
    finally:
        stop.set()
        for thread in threads:
            thread.join(60)
    _no_change_but_the_named_steps(upgraded[upgraded.rindex("Resources:"):].split("Duration:")[0], found["updated"],
                                   found["other"])
    at_the_restart = tally.failed + tally.streams_cut + tally.stream_refused
    window = max(tally.noted_at) - min(tally.noted_at) if tally.noted_at else 0.0
    report(f"upgrade with 2 replicas: {during} requests during the up, {len(tally.failed)} failed, "
           f"{len(tally.streams_cut)} streams cut, {len(tally.stream_refused)} refused, all within {window:.2f} s: "
           f"{sorted(set(at_the_restart))}")
    assert during > 0, tally
    # This release's upgrade restarts the front's resuming layer once (its program changed, docs/CHANGELOG.md). The
    # previous release's layer cannot hand over: it exits at SIGTERM, cutting what it carries, and its Caddyfile has
    # no retry for the layer until this up's proxy step reloads it. So what reaches the front between the old
    # layer's exit and the new one's start ends there, as the front's 502 or a cut stream (the load's clients do not
    # retry, so each worker fails as fast as it sends, hence a count per worker means nothing): one burst, within
    # seconds. The layer's later handovers cut none (tests/node/test_resume_handover.py).
    assert window <= RESTART_WINDOW_S, (window, at_the_restart)
    assert all(re.search(r"502|APIConnectionError|RemoteProtocolError|incomplete chunked read|peer closed", what)
               for what in at_the_restart), at_the_restart
    ok(run("verify"))
    ok(run("destroy"))
