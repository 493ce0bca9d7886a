"""Releases: pyproject's version is the one the code and the stack report, the changelog has an entry for it, and
plan and status say plainly when a stack was deployed by another release."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import kimi_cluster
from kimi_cluster import release

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT_VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
CHANGELOG = (ROOT / "docs" / "CHANGELOG.md").read_text()


def test_the_version_is_semantic_above_the_first_release_and_the_installed_one():
    assert re.fullmatch(r"\d+\.\d+\.\d+", PYPROJECT_VERSION)
    assert tuple(map(int, PYPROJECT_VERSION.split("."))) > (0, 1, 0)
    # An editable install keeps the version it was installed with: `pip install -e .` again after a bump.
    assert kimi_cluster.__version__ == release.__version__ == PYPROJECT_VERSION, "stale install: pip install -e ."


def test_without_an_install_the_checkouts_pyproject_gives_the_version(tmp_path: Path):
    assert release._from_pyproject() == PYPROJECT_VERSION
    other = tmp_path / "pyproject.toml"
    other.write_text('[project]\nname = "something-else"\nversion = "9.9.9"\n')
    assert release._from_pyproject(other) is None
    other.write_text("not toml [")
    assert release._from_pyproject(other) is None


def test_the_changelog_is_by_version_and_names_the_previous_releases_commit():
    versions = re.findall(r"^## (\d+\.\d+\.\d+)\b", CHANGELOG, re.M)
    assert versions[0] == PYPROJECT_VERSION and "0.1.0" in versions
    assert versions == sorted(versions, key=lambda v: tuple(map(int, v.split("."))), reverse=True)
    first = CHANGELOG[CHANGELOG.index("\n## 0.1.0"):]
    assert "ca9c2dc" in first.split("\n## ", 2)[1]
    # This release's entry names the previous release's commit, which the upgrade flow brings a stack up with.
    from kimi_cluster.sandbox.releases import PREVIOUS_RELEASE

    this = CHANGELOG.split(f"\n## {PYPROJECT_VERSION}\n", 1)[1].split("\n## ", 1)[0]
    assert f"`{PREVIOUS_RELEASE}`" in this
    for entry in re.split(r"^## ", CHANGELOG, flags=re.M)[1:]:
        # Each entry says what an `up` does to a running stack.
        assert "What an `up` does to a running stack" in entry, entry.splitlines()[0]


def test_the_note_says_plainly_when_the_stack_is_of_another_release():
    assert release.version_note("0.2.0", "0.2.0") is None
    older = release.version_note("0.1.9", "0.2.0")
    assert older and "0.1.9" in older and "0.2.0" in older and "CHANGELOG" in older
    newer = release.version_note("0.3.0", "0.2.0")
    assert newer and "NEWER" in newer
    before = release.version_note(None, "0.2.0")
    assert before and "before 0.2.0" in before
    assert release.release_view(None)["note"] is None  # nothing deployed yet: nothing to compare
    assert release.release_view({"endpoint_url": "x"}, "0.2.0")["note"] == before
    assert release.release_view({"kimi_cluster_version": "0.2.0"}, "0.2.0")["note"] is None


def test_this_releases_entry_names_the_steps_an_upgrade_runs_again() -> None:
    # The upgrade flow (tests/sandbox/test_upgrade_flow.py) lets exactly these steps run again, and no other.
    from kimi_cluster.plan.steps.table import NAMES
    from kimi_cluster.sandbox import releases

    named = releases.steps_run_again(CHANGELOG, release.__version__, keys=("replicas",))
    assert set(named) <= set(NAMES), named
    entry = CHANGELOG.split(f"\n## {release.__version__}\n", 1)[1].split("\n## ", 1)[0]
    # A release that runs nothing again says so in as many words, never by leaving the paragraph out.
    assert named or "Steps that run again: none." in entry, entry[:400]
    added = releases.steps_added(CHANGELOG, release.__version__, keys=("replicas",))
    assert set(added) <= set(NAMES), added
    for step in named:
        assert releases.unexpected_updates([f"command:remote:Command kimi-node3-{step} (update: create)"], named) == []
    assert releases.unexpected_updates(["command:remote:Command kimi-node0-ready-x (update: create)"], named) != []
    wait = "command:remote:Command kimi-front-ready-wait (update: create)"  # the readiness step's wrapped command
    assert releases.unexpected_updates([wait], ("readiness",)) == [] and releases.unexpected_updates([wait], ()) != []
    assert releases.unexpected_updates(["pulumi-python:dynamic/hyperstack:VirtualMachine kimi-node0 (update)"],
                                       named) != []


def test_a_step_named_under_a_key_counts_only_for_a_stack_that_sets_it() -> None:
    from kimi_cluster.sandbox import releases

    log = ("# Changelog\n\n## 9.9.9\n\nSteps that run again: `weights` (its program, `kimi_cluster/node/`; moved); "
           "with `kernelCache`: `cache-save`; with `idleStopMinutes` or `budgetUsd`: `proxy` and `caretaker`.\n\n"
           "Steps added: with `replicas` (on vLLM, `resumeStreams` on): `resume`.\n\n## 9.9.8\n\n"
           "Steps added: `launch`.\n")
    assert releases.steps_run_again(log, "9.9.9") == ("weights",)
    assert releases.steps_run_again(log, "9.9.9", keys=("budgetUsd",)) == ("weights", "proxy", "caretaker")
    assert releases.steps_added(log, "9.9.9") == ()
    assert releases.steps_added(log, "9.9.9", keys=("replicas",)) == ("resume",)
    assert releases.steps_added(log, "9.9.9", keys=("resumeStreams",)) == ()  # named in an aside only
    created = "command:remote:Command kimi-front-resume (create)"
    assert releases.unexpected_others([created], ("resume",)) == []
    assert releases.unexpected_others([created], ()) == [created]
    assert releases.unexpected_others(["command:remote:Command kimi-front-resume (delete)"], ("resume",)) != []
