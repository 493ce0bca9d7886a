"""Careless command lines end in one `error:` line and a usage exit code, never a traceback."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from kimi_cluster.cli import emulator as emulator_cli
from kimi_cluster.cli import plan as plan_cli
from kimi_cluster.cli import sandbox as sandbox_cli
from kimi_cluster.sandbox.workdir import MARKER, Workdir


def one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "\n" not in err and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("content,needle", [
    ("config: [unclosed\n", "is not valid YAML at line"),
    ("- just\n- a list\n", "expected a mapping"),
    ("config: 7\n", "'config' must be a mapping"),
    (b"\xff\xfe\x00config", "is not UTF-8"),
])
def test_plan_refuses_a_broken_stack_file(tmp_path, capsys, content, needle):
    path = tmp_path / "Pulumi.x.yaml"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    assert plan_cli.main(["--config", str(path)]) != 0
    assert needle in one_error_line(capsys)


def test_plan_refuses_a_directory_as_config_and_a_file_as_render_dir(tmp_path, capsys):
    assert plan_cli.main(["--config", str(tmp_path)]) != 0
    assert "is a directory" in one_error_line(capsys)
    afile = tmp_path / "render"
    afile.write_text("")
    assert plan_cli.main(["--stack", "dev", "--render-dir", str(afile)]) == 2
    assert "is a file" in one_error_line(capsys)


def test_emulator_refuses_a_busy_port_and_a_bad_one(capsys):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        assert emulator_cli.main(["--port", str(busy.getsockname()[1])]) == 2
        assert "cannot listen on 127.0.0.1" in one_error_line(capsys)
    with pytest.raises(SystemExit) as caught:
        emulator_cli.main(["--port", "70000"])
    assert caught.value.code == 2 and "is not a TCP port" in capsys.readouterr().err


def test_sandbox_refuses_a_workdir_that_is_a_file(tmp_path, capsys):
    afile = tmp_path / "work"
    afile.write_text("mine")
    for command in ("up", "verify", "destroy"):
        assert sandbox_cli.main([command, "--workdir", str(afile)]) == 2
        assert "is a file" in one_error_line(capsys)
    assert afile.read_text() == "mine"


def test_sandbox_never_adopts_a_directory_it_did_not_create(tmp_path, capsys):
    mine = tmp_path / "project"
    (mine / "secrets").mkdir(parents=True)
    (mine / "secrets" / "id_ed25519").write_text("the user's own key")
    (mine / "nodes").mkdir()
    (mine / "state.json").write_text('{"resources": []}')
    for command in ("up", "verify", "destroy"):
        assert sandbox_cli.main([command, "--workdir", str(mine)]) == 2
        text = one_error_line(capsys)
        assert "did not create" in text
    assert (mine / "secrets" / "id_ed25519").read_text() == "the user's own key" and (mine / "nodes").is_dir()
    assert not (mine / MARKER).exists()


def test_a_second_sandbox_command_in_one_workdir_is_refused(tmp_path, capsys):
    work = Workdir(tmp_path / "w")
    work.claim(create=True)
    with work.exclusive():
        assert sandbox_cli.main(["up", "--workdir", str(work.root)]) == 2
        assert "another sandbox command (pid" in one_error_line(capsys)
        assert sandbox_cli.main(["destroy", "--workdir", str(work.root)]) == 2
        one_error_line(capsys)
    assert not (work.root / "sandbox.json").exists()  # nothing was started


@pytest.mark.parametrize("option", ["--no-kernel-cache", "--kernel-cache", "--no-timeline", "--skip-preview"])
def test_the_sandboxs_up_options_are_refused_on_another_command(tmp_path, capsys, option):
    with pytest.raises(SystemExit) as caught:
        sandbox_cli.main(["destroy", "--workdir", str(tmp_path / "w"), option])
    assert caught.value.code == 2 and "apply to up only" in capsys.readouterr().err
    assert not (tmp_path / "w").exists()


def test_expect_no_changes_is_for_refresh_and_up_and_a_refresh_needs_a_deployed_sandbox(tmp_path, capsys):
    with pytest.raises(SystemExit) as caught:
        sandbox_cli.main(["verify", "--workdir", str(tmp_path / "w"), "--expect-no-changes"])
    assert caught.value.code == 2 and "applies to up and refresh only" in capsys.readouterr().err
    with pytest.raises(SystemExit) as caught:  # its changes are read from the preview's plan
        sandbox_cli.main(["up", "--workdir", str(tmp_path / "w"), "--expect-no-changes", "--skip-preview"])
    assert caught.value.code == 2 and "always previews" in capsys.readouterr().err
    for argv in (["refresh"], ["refresh", "--expect-no-changes"], ["up", "--expect-no-changes"]):
        assert sandbox_cli.main([*argv, "--workdir", str(tmp_path / "w")]) == 2
        one_error_line(capsys)  # no sandbox there: one line, no traceback
    assert not (tmp_path / "w").exists()


def test_sandbox_reports_a_broken_record_in_one_line(tmp_path, capsys):
    work = Workdir(tmp_path / "w")
    work.claim(create=True)
    Path(work.record_path).write_text("{ cut sho")
    assert sandbox_cli.main(["destroy", "--workdir", str(work.root)]) == 2
    assert "is not the sandbox's JSON record" in one_error_line(capsys)


def test_a_two_line_key_file_is_refused_without_printing_it(tmp_path, capsys):
    from kimi_cluster.cli import verify as verify_endpoint

    key_file = tmp_path / "key.txt"
    key_file.write_text("sk-first-line-secret\nsk-second-line-secret\n")
    assert verify_endpoint.main(["--base-url", "http://127.0.0.1:9", "--model", "m",
                                 "--api-key-file", str(key_file)]) == 2
    text = one_error_line(capsys)
    assert "holds 2 lines" in text and "secret" not in text
