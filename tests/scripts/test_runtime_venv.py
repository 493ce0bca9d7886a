"""requirements.txt alone runs the Pulumi programs: a fresh virtualenv with only that set imports them.

The program's modules (every module under components/, everything __main__.py imports, and the verification
stack's checks_resource and verification_stack) are imported in a new venv that holds requirements.txt's
distributions and everything they require, with the checkout on PYTHONPATH, as `pip install -r requirements.txt -e .`
would give. The only module allowed to miss something there is one that needs the verifier's client set
(requirements-verify.txt, for the `clients` check); with that set added, everything imports.

The set is not installed from the registry again: this suite's venv was installed by pip from these same pinned
files (requirements-dev.txt includes them), so the test checks each pin against what is installed, follows the
installed distributions' own requirements (their markers evaluated, extras only where asked for) and copies those
distributions' files, as their RECORD lists them, into the new venv. That gives pip's answer for these pins without
pip's walk over every file on each project's index page, which took about 20 CPU-seconds per set here.
Marked `runtime_venv`.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

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


def _requirement_names(name: str) -> set[str]:
    """Top-level import names of a requirements file's packages (`openai==1` -> openai)."""
    return {req.name.lower().replace("-", "_") for req in _requirements(name)}


def program_modules() -> list[str]:
    modules = set()
    # The rooms a Pulumi program reaches (the cluster's and the verification stack's), and 0.1.0's aliases.
    # Of the node programs, only what the plan reads (the rest runs on the VMs, with the node's own packages).
    rooms = [REPO / "kimi_cluster" / room for room in ("hyperstack", "settings", "plan", "deploy", "checks")]
    shared = [REPO / "kimi_cluster" / "node" / f"{m}.py"
              for m in ("weights", "hub_names", "printable", "caretaker_spend")]
    for path in [*shared, *(p for folder in (*rooms, REPO / "components") for p in folder.rglob("*.py"))]:
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


def _requirements(name: str) -> list[Requirement]:
    lines = (line.split("#", 1)[0].strip() for line in (REPO / name).read_text().splitlines())
    return [Requirement(line) for line in lines if line and not line.startswith("-")]


def closure(*requirement_files: str) -> dict[str, metadata.Distribution]:
    """The installed distributions that the files pin, and everything those require, by canonical name.

    Each pin must match the version installed here, else this venv is not what the files say."""
    found: dict[str, metadata.Distribution] = {}
    done: set[tuple[str, str]] = set()
    todo = [(req, name) for name in requirement_files for req in _requirements(name)]
    while todo:
        req, wanted_by = todo.pop()
        key = canonicalize_name(req.name)
        extras = sorted(req.extras) or [""]
        if all((key, extra) in done for extra in extras):
            continue
        try:
            dist = metadata.distribution(req.name)
        except metadata.PackageNotFoundError:
            pytest.fail(f"{req} (wanted by {wanted_by}) is not installed in this suite's venv: "
                        "pip install -r requirements-dev.txt")
        assert req.specifier.contains(dist.version, prereleases=True), (
            f"{wanted_by} wants {req}, but this suite's venv has {req.name} {dist.version}")
        found[key] = dist
        for extra in extras:
            done.add((key, extra))
            for text in dist.requires or []:
                needed = Requirement(text)
                if needed.marker is None or needed.marker.evaluate({"extra": extra}):
                    todo.append((needed, f"{req.name} {dist.version}"))
    return found


def _install(venv: Path, dists: dict[str, metadata.Distribution]) -> int:
    """Links the distributions' files (those under site-packages) into the venv's site-packages; returns how many.

    A hard link (a copy with its times where the two folders are on different file systems) keeps each source
    file's modification time, so the byte code pip compiled at install, listed in RECORD too, stays valid: the
    imports below then read it instead of compiling every module again (about 4 CPU-seconds)."""
    site = next((venv / "lib").glob("python*/site-packages"))
    copied = 0
    for dist in dists.values():
        for entry in dist.files or []:
            if entry.parts[0] == "..":  # console scripts and the like, outside site-packages: nothing imports them
                continue
            source, target = Path(str(dist.locate_file(entry))), site / entry
            if source.is_file() and not target.exists():
                target.parent.mkdir(parents=True, exist_ok=True)
                try:
                    os.link(source, target)
                except OSError:
                    shutil.copy2(source, target)
                copied += 1
    return copied


def test_the_program_imports_with_requirements_txt_alone(tmp_path: Path) -> None:
    venv = tmp_path / "runtime-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    runtime_set = closure("requirements.txt")
    assert {"pulumi", "pulumi-command", "pydantic", "grpcio"} <= set(runtime_set)
    assert "openai" not in runtime_set  # the verifier's set is not pulled in by the runtime set
    assert _install(venv, runtime_set) > 0
    modules = program_modules()
    assert "kimi_cluster.deploy.cluster" in modules and "checks_resource" in modules

    verify_names = _requirement_names("requirements-verify.txt")
    runtime = _import_all(python, modules)
    broken = {m: why for m, why in runtime.items() if why and not (why.startswith("missing:") and
                                                                    why.split(":", 1)[1].split(".")[0] in verify_names)}
    assert broken == {}, f"modules that requirements.txt does not make importable: {broken}"
    # What the cluster program's __main__.py imports needs nothing beyond requirements.txt.
    needs_verify = {m for m, why in runtime.items() if why}
    assert not needs_verify & _main_imports(), needs_verify

    assert _install(venv, closure("requirements.txt", "requirements-verify.txt")) > 0
    assert {m: why for m, why in _import_all(python, modules).items() if why} == {}


def _main_imports() -> set[str]:
    found = set()
    for node in ast.walk(ast.parse((REPO / "__main__.py").read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found
