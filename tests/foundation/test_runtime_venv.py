"""requirements.txt alone runs the Pulumi programs: a fresh virtualenv with only that set imports them.

The program's modules (every module under components/, everything __main__.py imports, and the verification
stack's checks_resource and verification_stack) are imported in a new venv that has requirements.txt installed and
the checkout on PYTHONPATH, as `pip install -r requirements.txt -e .` would give. The only module allowed to miss
something there is one that needs the verifier's client set (requirements-verify.txt, for the `clients` check);
with that set added, everything imports. Marked `runtime_venv` (it installs from the registry or the pip cache).
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.runtime_venv, pytest.mark.timeout(900)]

# Tries each module named on stdin; answers, per module, null or the name of the module it could not find.
CHILD = """
import importlib, json, sys, traceback
result = {}
for name in json.load(sys.stdin):
    try:
        importlib.import_module(name)
        result[name] = None
    except ModuleNotFoundError as err:
        result[name] = "missing:" + str(err.name)
    except Exception:
        result[name] = "error:" + traceback.format_exc()[-2000:]
print(json.dumps(result))
"""


def _requirement_names(path: Path) -> set[str]:
    """Top-level import names of a requirements file's packages (`openai==1` -> openai)."""
    names = set()
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line and not line.startswith("-"):
            names.add(re.split(r"[\[=<>~! ]", line, maxsplit=1)[0].lower().replace("-", "_"))
    return names


def program_modules() -> list[str]:
    modules = set()
    for path in (REPO / "components").rglob("*.py"):
        parts = path.relative_to(REPO).with_suffix("").parts
        modules.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    modules.update(_main_imports())
    modules.update(p.stem for p in (REPO / "verification").glob("*.py") if p.stem != "__main__")
    return sorted(modules)


def _import_all(python: Path, modules: list[str]) -> dict[str, str | None]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(REPO / "verification")])
    done = subprocess.run([str(python), "-c", CHILD], input=json.dumps(modules), capture_output=True, text=True,
                          cwd=REPO, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _pip(python: Path, *requirement_files: str) -> None:
    # This suite's pip installs into the new venv (`--python`, so the venv needs no pip of its own), without
    # compiling every installed module up front: only the imports below need byte code, and they compile their own.
    argv = [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--disable-pip-version-check",
            "--no-compile"]
    for name in requirement_files:
        argv += ["-r", str(REPO / name)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=800)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]


def test_the_program_imports_with_requirements_txt_alone(tmp_path: Path) -> None:
    venv = tmp_path / "runtime-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    _pip(python, "requirements.txt")
    modules = program_modules()
    assert "components.cluster" in modules and "checks_resource" in modules

    verify_names = _requirement_names(REPO / "requirements-verify.txt")
    runtime = _import_all(python, modules)
    broken = {m: why for m, why in runtime.items() if why and not (why.startswith("missing:") and
                                                                    why.split(":", 1)[1].split(".")[0] in verify_names)}
    assert broken == {}, f"modules that requirements.txt does not make importable: {broken}"
    # What the cluster program's __main__.py imports needs nothing beyond requirements.txt.
    needs_verify = {m for m, why in runtime.items() if why}
    assert not needs_verify & _main_imports(), needs_verify

    _pip(python, "requirements-verify.txt")
    assert {m: why for m, why in _import_all(python, modules).items() if why} == {}


def _main_imports() -> set[str]:
    found = set()
    for node in ast.walk(ast.parse((REPO / "__main__.py").read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found
