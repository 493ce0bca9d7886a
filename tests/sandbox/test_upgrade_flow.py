"""A running cluster survives its own upgrade: a sandbox stack brought up by the previous release (a git worktree
of its commit, named in docs/CHANGELOG.md, with its own virtualenv) is upgraded by `up` with the working tree on the
same workdir and state. The CLI's own preview (`pulumi preview --diff --json`) proves that no VM, keypair,
environment, rule, certificate, host key or generated secret is replaced, created or deleted, and that no node step
runs again (what the changelog's 0.2.0 entry says); the up itself creates, replaces and deletes nothing, and
`verify` passes. A change that would replace a VM fails this test on its own: its changelog entry must then say
so, and this test must be told to expect it.
"""

from __future__ import annotations

import io
import re

import pytest

from components.release import VERSION_OUTPUT, __version__
from sandbox import releases

from .conftest import NOT_COMPILING, leftover_processes, ok, report

pytestmark = [pytest.mark.flow, pytest.mark.timeout(2400)]


def test_a_stack_of_the_previous_release_upgrades_with_nothing_replaced(sandbox) -> None:
    old = releases.release_checkout(releases.PREVIOUS_RELEASE)
    run = sandbox()
    first = releases.sandbox_command(old, run.workdir, "up", "--topology", "h100x4-sglang", "--no-timeline",
                                     "--no-kernel-cache", "--quiet", env=NOT_COMPILING)
    assert first.returncode == 0, first.stdout[-4000:]
    assert VERSION_OUTPUT not in run.outputs()  # 0.1.0 recorded no release
    assert "deployed by kimi-cluster before 0.2.0" in ok(run("status"))

    plan = releases.preview_upgrade(run.workdir, io.StringIO())
    found = releases.verdict(plan["steps"])
    summary = plan.get("changeSummary") or {}
    report(f"upgrade {releases.PREVIOUS_RELEASE} -> {__version__}: the preview's changeSummary {summary}; "
           f"replaced {len(found['replaced'])}, updated {len(found['updated'])}, other {len(found['other'])}")
    assert found["replaced"] == [], releases.describe(found)
    # Every resource of the 4-node stack is the same (the stack's outputs change: a new one, a fresh price's time).
    assert set(summary) == {"same"} and summary["same"] >= 60, summary
    # No node step runs again, nothing else changes (the stack's outputs are no resource step).
    assert found["updated"] == [] and found["other"] == [], releases.describe(found)

    upgraded = ok(run("up"))
    summary = upgraded[upgraded.rindex("Resources:"):].split("Duration:")[0]
    assert not re.search(r"created|replaced|deleted|updated", summary), summary
    assert run.outputs()[VERSION_OUTPUT] == __version__
    assert "release:" not in ok(run("status"))
    assert "no changes" in ok(run("refresh", "--expect-no-changes"))
    assert "no changes" in ok(run("up", "--expect-no-changes"))
    ok(run("verify"))
    ok(run("destroy"))
    assert leftover_processes(run.workdir) == []
