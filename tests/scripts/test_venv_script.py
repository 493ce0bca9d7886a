"""scripts/venv.sh, which makes the README's virtualenvs: the interpreter it picks, and what it does when one fails.

The interpreters here are small bash stand-ins given through KIMI_PYTHON (the same setting a user has), each
answering the version check and `-m venv DIR` the way a real one does, or failing as one can. The real interpreter
path runs wherever the README's commands run (CI makes both of its venvs with this script).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration  # starts fake nodes, servers or outside tools

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "venv.sh"


def run(directory: Path, python: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin"}
    if python is not None:
        env["KIMI_PYTHON"] = python
    return subprocess.run(["bash", str(SCRIPT), str(directory)], capture_output=True, text=True, env=env,
                          timeout=120, check=False)


def stand_in(tmp_path: Path, name: str, body: str) -> str:
    path = tmp_path / name
    path.write_text("#!/bin/bash\n" + body)
    path.chmod(0o755)
    return str(path)


def test_it_makes_the_venv_from_the_given_interpreter_and_keeps_an_existing_one(tmp_path: Path) -> None:
    # A real venv from a real interpreter is what the README's commands (and CI) make with this script each run.
    good = stand_in(tmp_path, "good", 'case "$1" in -c) exit 0;; -V) echo "Python 3.12.4";; '
                                      f'-m) mkdir -p "$3/bin"; ln -s {sys.executable} "$3/bin/python";; esac\n')
    made = run(tmp_path / "v", good)
    assert made.returncode == 0, made.stderr
    assert made.stdout.strip() == f"{tmp_path / 'v'}: Python {sys.version.split()[0]} from {good}"
    marker = tmp_path / "v" / "kept"
    marker.write_text("")
    again = run(tmp_path / "v", "/nonexistent/python")  # an existing venv is not made again, whatever is asked
    assert again.returncode == 0 and marker.exists() and again.stdout == ""


def test_a_missing_or_too_old_interpreter_is_named_and_nothing_is_made(tmp_path: Path) -> None:
    missing = run(tmp_path / "a", "/nonexistent/python")
    assert missing.returncode == 1 and "/nonexistent/python: not found" in missing.stderr
    assert "KIMI_PYTHON" in missing.stderr and not (tmp_path / "a").exists()
    old = stand_in(tmp_path, "old", 'case "$1" in -c) exit 1;; -V) echo "Python 3.10.12";; esac\n')
    refused = run(tmp_path / "b", old)
    assert refused.returncode == 1 and "Python 3.10.12, older than 3.11" in refused.stderr
    assert not (tmp_path / "b").exists()


def test_a_venv_that_fails_half_made_is_removed_but_a_folder_that_was_there_is_kept(tmp_path: Path) -> None:
    # Debian's python3 without python3-venv: venv makes bin/python, then stops at ensurepip.
    half = stand_in(tmp_path, "half", 'case "$1" in -c) exit 0;; -m) mkdir -p "$3/bin"; touch "$3/bin/python"; '
                                      'echo "ensurepip is not available" >&2; exit 1;; esac\n')
    failed = run(tmp_path / "new", half)
    assert failed.returncode == 1 and "venv failed: ensurepip is not available" in failed.stderr
    assert not (tmp_path / "new").exists()
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("a user's file")
    failed_again = run(tmp_path / "mine", half)
    assert failed_again.returncode == 1 and (tmp_path / "mine" / "notes.txt").exists()
