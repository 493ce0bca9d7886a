"""The release of this checkout: `__version__`, and what a stack deployed by another release should be told.

The version is the package's (`pyproject.toml`, raised with every change a running stack would notice; the changelog,
docs/CHANGELOG.md, says per release what an `up` does to a running stack). It is read from the installed
distribution's metadata (`pip install -e .` records it), else from the checkout's own `pyproject.toml`, so a
checkout run without an install still knows its release. An editable install keeps the version it was installed
with: run `pip install -e .` again after a pull (tests/repository/test_release.py fails on a stale one).

The stack records the release that deployed it as the output `kimi_cluster_version`; `kimi-cluster plan` and
`kimi-cluster status` compare it with this checkout's (`version_note`).
"""

from __future__ import annotations

import re
import tomllib
from importlib import metadata
from pathlib import Path

DISTRIBUTION = "kimi-cluster"
VERSION_OUTPUT = "kimi_cluster_version"
PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"
# Releases before 0.2.0 exported no version: a stack without the output was deployed by one of them.
FIRST_RECORDED = "0.2.0"
_SEMVER = re.compile(r"(\d+)\.(\d+)\.(\d+)")


def _from_pyproject(path: Path = PYPROJECT) -> str | None:
    try:
        project = tomllib.loads(path.read_text()).get("project") or {}
    except (OSError, tomllib.TOMLDecodeError):
        return None
    version = project.get("version") if project.get("name") == DISTRIBUTION else None
    return version if isinstance(version, str) else None


def checkout_version() -> str:
    """This checkout's release: the installed metadata's, else pyproject.toml's, else "unknown"."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return _from_pyproject() or "unknown"


__version__ = checkout_version()


def _key(version: str) -> tuple[int, ...] | None:
    m = _SEMVER.fullmatch(version.strip())
    return tuple(int(part) for part in m.groups()) if m else None


def version_note(deployed: object, checkout: str = __version__) -> str | None:
    """One plain line when the stack was deployed by another release than this checkout's, else None.

    `deployed` is the stack's `kimi_cluster_version` output: None for a stack of a release before 0.2.0 (or one
    never deployed: the caller says which it has)."""
    if deployed is None:
        return (f"this stack was deployed by kimi-cluster before {FIRST_RECORDED} (it records no "
                f"{VERSION_OUTPUT}); this checkout is {checkout}: read docs/CHANGELOG.md from that release up before "
                "`pulumi up`, which upgrades it")
    deployed = str(deployed)
    if deployed == checkout:
        return None
    old, new = _key(deployed), _key(checkout)
    if old is not None and new is not None and old > new:
        return (f"this stack was deployed by kimi-cluster {deployed}, NEWER than this checkout's {checkout}: "
                "`pulumi up` from here would take it back to an older release; update the checkout first")
    return (f"this stack was deployed by kimi-cluster {deployed}; this checkout is {checkout}: `pulumi up` upgrades "
            f"it, and docs/CHANGELOG.md says per release what that runs again and whether anything is replaced")


def deployed_outputs(stack: str, cwd: str | Path, timeout: float = 60.0) -> dict[str, object] | None:
    """`pulumi stack output --json` of a deployed stack (its plain outputs: the version is one), or None when there
    is no CLI, no such stack or no answer: a plan for a stack not yet deployed has nothing to compare."""
    import json
    import shutil
    import subprocess

    if shutil.which("pulumi") is None:
        return None
    try:
        done = subprocess.run(["pulumi", "stack", "output", "--json", "--stack", stack, "--non-interactive"],
                              cwd=cwd, capture_output=True, text=True, timeout=timeout)
        outputs = json.loads(done.stdout) if done.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired, ValueError):
        return None
    return outputs if isinstance(outputs, dict) and outputs else None


def release_view(outputs: dict[str, object] | None, checkout: str = __version__) -> dict[str, object]:
    """What plan and status print and give as JSON: this checkout's release, the stack's, and the note."""
    if not outputs:  # nothing deployed yet, or an up before its outputs were registered
        return {"checkout": checkout, "deployed": None, "note": None}
    deployed = outputs.get(VERSION_OUTPUT)
    return {"checkout": checkout, "deployed": deployed, "note": version_note(deployed, checkout)}
