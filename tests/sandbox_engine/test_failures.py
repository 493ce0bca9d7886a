"""Failures: a provider that only works in the program's process, a failing resource, a failing node command."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandbox.engine import DeploymentFailed, run_up

from .conftest import ops, state, state_names

pytestmark = pytest.mark.timeout(60)


def test_a_provider_that_only_works_in_process_fails_under_the_engine(
    make_project, tmp_path: Path, toy_dir: Path
) -> None:
    # Under plain pulumi mocks this provider would work: the program set the global it reads. On a real
    # `pulumi up` (and here) the provider is unpickled in another process, where the global is unset.
    project, workdir = make_project("inproc"), tmp_path / "work"
    with pytest.raises(DeploymentFailed) as failed:
        run_up(project, "dev", workdir, {"toyDir": str(toy_dir)}, echo=False)
    assert "'needs-global'" in str(failed.value)
    assert "PROGRAM_TOKEN is not set in the provider's process" in str(failed.value)
    assert "fine" in state_names(workdir)
    assert "needs-global" not in state_names(workdir)


def test_a_failed_resource_fails_up_keeps_completed_ones_and_a_rerun_finishes(
    make_project, tmp_path: Path, toy_dir: Path
) -> None:
    project, workdir = make_project("failing"), tmp_path / "work"
    (toy_dir / "fail-flaky").write_text("")
    with pytest.raises(DeploymentFailed) as failed:
        run_up(project, "dev", workdir, {"toyDir": str(toy_dir)}, echo=False)
    assert failed.value.failures == [
        "pulumi-python:dynamic/toy:FlakyFile 'flaky': create failed: RuntimeError: flag file fail-flaky exists"
    ]
    assert "ok" in state_names(workdir) and "flaky" not in state_names(workdir)

    (toy_dir / "fail-flaky").unlink()
    result = run_up(project, "dev", workdir, {"toyDir": str(toy_dir)}, echo=False)
    assert result.outputs["flaky_path"] == str(toy_dir / "files" / "flaky")
    assert ops(toy_dir, "create") == ["ok", "flaky"]


def test_a_failing_node_command_reports_its_output_tail_but_never_its_stdin(
    make_project, tmp_path: Path, toy_dir: Path
) -> None:
    project, workdir = make_project("failing"), tmp_path / "work"
    token = "stdin-secret-4f2a9c"
    with pytest.raises(DeploymentFailed) as failed:
        run_up(project, "dev", workdir, {"toyDir": str(toy_dir), "failCommand": "true"},
               secret_overrides={"token": token}, echo=False)
    message = str(failed.value)
    assert "command:remote:Command 'breaks': create failed: create command exited with code 3" in message
    assert "disk full on /data" in message
    assert token not in message and token not in failed.value.log
    assert "breaks" not in state_names(workdir)


def test_a_program_exception_fails_up_with_its_traceback(make_project, tmp_path: Path, toy_dir: Path) -> None:
    project, workdir = make_project("failing"), tmp_path / "work"
    with pytest.raises(DeploymentFailed) as failed:
        run_up(project, "dev", workdir, {"toyDir": str(toy_dir), "crash": "true"}, echo=False)
    assert "the program failed: ValueError: the program was told to crash" in str(failed.value)
    assert 'raise ValueError("the program was told to crash")' in failed.value.log


def test_a_secure_config_value_needs_an_override(make_project, tmp_path: Path, toy_dir: Path) -> None:
    project, workdir = make_project("basic"), tmp_path / "work"
    with pytest.raises(DeploymentFailed) as failed:
        run_up(project, "dev", workdir, {"toyDir": str(toy_dir)}, echo=False)
    assert "toy:apiKey" in str(failed.value) and "cannot be decrypted" in str(failed.value)
    assert not (workdir / "state.json").exists() or state(workdir)["resources"] == []
