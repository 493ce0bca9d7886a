"""The package as a wheel: one import name, its templates and node programs inside, its command from anywhere.

`pip wheel` builds the wheel from the checkout (pyproject.toml); a fresh venv gets requirements.txt's distributions
the way tests/scripts/test_runtime_venv.py gives them (linked from this suite's venv, so no registry walk) and the
wheel with --no-deps, as a non-editable `pip install .` would leave it. Then `kimi-cluster plan` runs from a
directory that is not the checkout, renders every node script (the templates and the shipped node programs come from
the installed package), and the old top-level names of 0.1.0 are not importable there (the wheel ships only
kimi_cluster). Marked `runtime_venv`.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.scripts.test_runtime_venv import _install, closure

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.runtime_venv, pytest.mark.timeout(900)]


def _run(argv: list[str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def test_a_non_editable_install_runs_the_plan_from_another_directory(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    built = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), str(REPO)], tmp_path)
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = wheels.glob("kimi_cluster-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/", 1)[0] for n in names if not n.split("/", 1)[0].endswith(".dist-info")}
    assert tops == {"kimi_cluster"}, tops
    assert "kimi_cluster/plan/templates/weights.sh.j2" in names and "kimi_cluster/node/fetch_weights.py" in names

    venv = tmp_path / "venv"
    assert _run([sys.executable, "-m", "venv", str(venv)], tmp_path, 120).returncode == 0
    assert _install(venv, closure("requirements.txt")) > 0
    pip = _run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)],
               tmp_path)
    assert pip.returncode == 0, pip.stderr[-3000:]

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    render = elsewhere / "render"
    plan = _run([str(venv / "bin" / "kimi-cluster"), "plan", "--config", str(REPO / "Pulumi.dev.yaml"),
                 "--render-dir", str(render)], elsewhere)
    assert plan.returncode == 0, plan.stderr[-3000:]
    assert "kimi-cluster plan for stack 'dev'" in plan.stdout
    weights = (render / "kimi-dev-node1" / "weights.sh").read_text()
    assert "kimi_cluster/node/fetch_weights.py" in weights and (REPO / "kimi_cluster").as_posix() not in weights
    old = _run([str(venv / "bin" / "python"), "-c", "import components"], elsewhere)
    assert old.returncode != 0 and "No module named 'components'" in old.stderr
