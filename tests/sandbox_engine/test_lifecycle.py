"""The sandbox engine end to end on a toy program: up, a no-op second up, updates and replacements, destroy."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandbox.engine import UpResult, run_destroy, run_up
from sandbox.props import is_secret

from .conftest import PROGRAMS, calls, ops, state, state_names

pytestmark = pytest.mark.timeout(60)

API_KEY = "sk-test-0123456789abcdef"


def up(project: Path, workdir: Path, toy_dir: Path, stubs: Path, **config: str) -> UpResult:
    return run_up(
        project, "dev", workdir, {"toyDir": str(toy_dir), **config},
        node_path_prefix=[stubs], node_env={"NODE_FLAG": "yes"},
        secret_overrides={"apiKey": API_KEY}, echo=False,
    )


@pytest.fixture(scope="module")
def first_up(tmp_path_factory: pytest.TempPathFactory):
    """One `up` of the basic program, shared by the tests that only look at its results."""
    import shutil

    root = tmp_path_factory.mktemp("first-up")
    project = root / "basic"
    shutil.copytree(PROGRAMS / "basic", project)
    shutil.copy(PROGRAMS / "toyprov.py", project)
    toy_dir, stubs = root / "toy", root / "stubs"
    toy_dir.mkdir()
    stubs.mkdir()
    (stubs / "nvidia-smi").write_text("#!/bin/sh\necho stub-gpu\n")
    (stubs / "nvidia-smi").chmod(0o755)
    workdir = root / "work"
    return up(project, workdir, toy_dir, stubs), workdir, toy_dir


def test_up_creates_everything_and_returns_outputs(first_up) -> None:
    result, workdir, toy_dir = first_up
    assert result.outputs["hello"] == "hello-world"
    assert result.outputs["second_path"] == str(toy_dir / "files" / "grp-second")
    # The dynamic provider's configure() got the stack config, namespaced under the project.
    assert result.outputs["greeting"] == "hi"
    assert result.outputs["probe_project"] == "toy"
    # ...and only through configure: the host's environment holds no program config, as under the real engine.
    assert result.outputs["probe_sdk_greeting"] == "(unset)" and result.outputs["probe_env_config"] is False
    assert {"token", "api_key"} <= result.secret_outputs
    assert result.outputs["api_key"] == API_KEY
    assert result.outputs["token"].startswith("tok-")
    assert sorted(p.name for p in (toy_dir / "files").iterdir()) == ["extra", "grp-first", "grp-second"]
    assert set(state_names(workdir)) == {
        "toy-dev", "grp", "grp-first", "grp-second", "token", "probe", "extra", "cmd", "hello", "n0-work", "n1-work",
    }
    assert result.counts["create"] == len(state_names(workdir))
    assert state(workdir)["pending_operations"] == []
    # A read resource goes through the provider's read and is not managed (not in state, never deleted).
    assert result.outputs["seen_id"] == "token-file-that-exists-elsewhere"


def test_dynamic_providers_run_outside_the_program_process(first_up) -> None:
    result, _, toy_dir = first_up
    pids = {c["pid"] for c in calls(toy_dir)}
    assert len(pids) == 1
    assert result.outputs["program_pid"] not in pids


def test_node_commands_run_in_their_host_directory_with_stubs_and_stdin(first_up) -> None:
    result, workdir, _ = first_up
    n0 = workdir / "nodes" / "n0"
    assert result.outputs["node_out"].splitlines() == [f"home={n0}", f"pwd={n0}", "stub-gpu", "flag=yes"]
    assert (n0 / "stdin.txt").read_text() == API_KEY
    assert (workdir / "nodes" / "n1" / "stdin.txt").exists()


def test_depends_on_without_a_data_dependency_is_waited_for(first_up) -> None:
    _, _, toy_dir = first_up
    log = calls(toy_dir)
    first_end = next(c["t"] for c in log if c["name"] == "grp-first" and c["phase"] == "end")
    second_start = next(c["t"] for c in log if c["name"] == "grp-second" and c["phase"] == "start")
    # grp-first takes 0.4 s to create; grp-second only waits for it through depends_on.
    assert first_end <= second_start


def test_independent_node_commands_run_concurrently(first_up) -> None:
    _, workdir, _ = first_up
    starts = [float((workdir / "nodes" / h / "start").read_text()) for h in ("n0", "n1")]
    ends = [float((workdir / "nodes" / h / "end").read_text()) for h in ("n0", "n1")]
    # Each sleeps 1 s: in turn they would need 2 s.
    assert max(ends) - min(starts) < 1.8


def test_secrets_are_stored_marked_and_never_printed(first_up) -> None:
    result, workdir, _ = first_up
    token = result.outputs["token"]
    assert API_KEY not in result.log and token not in result.log
    assert "api_key: [secret]" in result.log and "token: [secret]" in result.log
    resources = {r["name"]: r for r in state(workdir)["resources"]}
    assert is_secret(resources["token"]["outputs"]["token"])
    assert is_secret(resources["toy-dev"]["outputs"]["api_key"])
    assert is_secret(resources["n0-work"]["inputs"]["stdin"])
    assert is_secret(resources["n0-work"]["outputs"]["connection"])
    assert (workdir / "state.json").stat().st_mode & 0o077 == 0


def test_second_up_changes_nothing(make_project, tmp_path: Path, toy_dir: Path, stubs: Path) -> None:
    project, workdir = make_project("basic"), tmp_path / "work"
    first = up(project, workdir, toy_dir, stubs)
    before = calls(toy_dir)
    second = up(project, workdir, toy_dir, stubs)
    assert calls(toy_dir) == before
    assert set(second.counts) == {"same"}
    assert second.counts["same"] == first.counts["create"]
    assert {k: v for k, v in second.outputs.items() if k != "program_pid"} == {
        k: v for k, v in first.outputs.items() if k != "program_pid"
    }


def test_changed_inputs_update_in_place_replace_and_delete_leftovers(
    make_project, tmp_path: Path, toy_dir: Path, stubs: Path
) -> None:
    project, workdir = make_project("basic"), tmp_path / "work"
    up(project, workdir, toy_dir, stubs)
    creates_before = ops(toy_dir, "create")
    changed = up(project, workdir, toy_dir, stubs,
                 firstContent="uno", secondName="renamed", trigger="t1", withExtra="false")
    assert changed.counts["update"] == 1  # grp-first: content changes in place
    assert changed.counts["replace"] == 3  # grp-second (new name), n0-work and n1-work (triggers)
    assert ops(toy_dir, "update") == ["grp-first"]
    assert ops(toy_dir, "create")[len(creates_before):] == ["renamed"]
    # The replaced file and the resource the program dropped are deleted at the end.
    assert sorted(ops(toy_dir, "delete")) == ["extra", "grp-second"]
    assert (toy_dir / "files" / "grp-first").read_text() == "uno"
    assert sorted(p.name for p in (toy_dir / "files").iterdir()) == ["grp-first", "renamed"]
    # Replaced commands: the new one's create ran, then the old one's delete.
    assert (workdir / "nodes" / "n0" / "deletions").read_text() == "deleted\n"
    doc = state(workdir)
    assert "extra" not in [r["name"] for r in doc["resources"]]
    assert not any(r["delete"] for r in doc["resources"])
    assert changed.outputs["second_path"] == str(toy_dir / "files" / "renamed")


def test_destroy_deletes_everything_dependents_first(make_project, tmp_path: Path, toy_dir: Path, stubs: Path) -> None:
    project, workdir = make_project("basic"), tmp_path / "work"
    up(project, workdir, toy_dir, stubs)
    result = run_destroy(project, "dev", workdir, secret_overrides={"apiKey": API_KEY}, echo=False)
    assert list((toy_dir / "files").iterdir()) == []
    assert state(workdir)["resources"] == []
    deletes = ops(toy_dir, "delete")
    assert sorted(deletes) == ["extra", "grp-first", "grp-second", "token"]
    assert deletes.index("grp-second") < deletes.index("grp-first")
    # The local command ran its delete before its explicit provider resource went.
    assert (toy_dir / "local-deleted").read_text() == "bye\n"
    assert result.log.index("command:local:Command hello deleted") < result.log.index("pulumi:providers:command cmd")
    for host in ("n0", "n1"):
        assert not (workdir / "nodes" / host / "stdin.txt").exists()
    assert result.counts["delete"] == 11
    again = run_destroy(project, "dev", workdir, secret_overrides={"apiKey": API_KEY}, echo=False)
    assert "nothing to destroy" in again.log


def test_a_stack_reference_reads_another_sandbox_stack(first_up, make_project, tmp_path: Path) -> None:
    _, upstream_workdir, _ = first_up
    result = run_up(make_project("ref"), "dev", tmp_path / "work",
                    stack_references={"org/toy/dev": upstream_workdir}, echo=False)
    assert result.outputs == {"upstream_hello": "hello-world", "upstream_key": API_KEY}
    # Secret upstream stays secret downstream.
    assert result.secret_outputs == {"upstream_key"}
    assert API_KEY not in result.log
