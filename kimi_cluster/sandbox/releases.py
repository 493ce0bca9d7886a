"""A previous release of kimi-cluster beside this checkout, to bring a sandbox stack up with it and upgrade that
stack with the working tree: what an operator does when they pull a new release under a live stack.

`release_checkout(commit)` makes a `git worktree` of the release's commit (docs/CHANGELOG.md names each release's)
with its own virtualenv (`bash scripts/venv.sh`, then `pip install -r requirements-dev.txt -e .` there), kept under
~/.cache/kimi-cluster/releases/ for the next run. `sandbox_command` runs that checkout's own sandbox door on a
workdir; `preview_upgrade` points the workdir's cluster project at this checkout (its `Pulumi.yaml`'s `main` and
virtualenv, as this checkout's sandbox writes them; the stack's config stays as the release's up set it) and runs
`pulumi preview --diff --json` there: the CLI's own verdict on what an `up` with this checkout would do.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from kimi_cluster.plan.steps.table import BY_NAME
from kimi_cluster.sandbox.cli_stacks import CliStacks
from kimi_cluster.sandbox.nodes import parsers_vllm
from kimi_cluster.sandbox.refresh import json_documents

REPO_ROOT = Path(__file__).resolve().parents[2]
# The release before this checkout's (docs/CHANGELOG.md names each release's commit): 0.3.2.
PREVIOUS_RELEASE = "c132b7e"
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kimi-cluster" / "releases"
INSTALL_TIMEOUT_S = 1200
# What an upgrade must never replace (nor delete or create anew): each bills, holds the cluster's identity or is
# trusted by its clients.
KEPT_TYPES = ("hyperstack:VirtualMachine", "hyperstack:Keypair", "hyperstack:Environment", "hyperstack:SecurityRule",
              "kimi:CertificateAuthority", "kimi:ServerCertificate", "kimi:NodeHostKey", "kimi:GeneratedSecret")
REPLACING = ("replace", "create-replacement", "delete-replaced", "create", "delete", "discard")


class ReleaseError(Exception):
    """The release's checkout or virtualenv cannot be made; the message says what failed."""


def _run(argv: list[str], cwd: Path, timeout: float = INSTALL_TIMEOUT_S) -> str:
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise ReleaseError(f"{' '.join(argv[:4])} failed ({done.returncode}): {(done.stderr or done.stdout)[-800:]}")
    return done.stdout


def release_checkout(commit: str = PREVIOUS_RELEASE, cache: Path = CACHE) -> Path:
    """The release's worktree with its virtualenv installed (made once, then reused)."""
    try:
        full = _run(["git", "rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}"], REPO_ROOT, 60).strip()
    except ReleaseError:
        raise ReleaseError(f"the release's commit {commit} is not in this clone's history (a shallow clone?): "
                           "git fetch --unshallow, then run again") from None
    place = cache / full[:12]
    cache.mkdir(parents=True, exist_ok=True)
    # One maker at a time: two tests (two xdist workers) asking for the same release wait for one checkout.
    with open(cache / f"{full[:12]}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _make_checkout(place, full)


def _make_checkout(place: Path, full: str) -> Path:
    python = place / ".venv" / "bin" / "python"
    done_marker = place / ".venv" / "kimi-release-installed"
    if not (place / ".git").exists():
        _run(["git", "worktree", "prune"], REPO_ROOT, 60)
        _run(["git", "worktree", "add", "--force", "--detach", str(place), full], REPO_ROOT, 300)
    head = _run(["git", "rev-parse", "HEAD"], place, 60).strip()
    if head != full:
        raise ReleaseError(f"{place} is at {head[:12]}, not the release's {full[:12]}: remove it and run again")
    if not done_marker.exists():
        _run(["bash", "scripts/venv.sh", ".venv"], place)
        _run([str(python), "-m", "pip", "install", "-q", "-r", "requirements-dev.txt", "-e", "."], place)
        done_marker.write_text(full + "\n")
    return place


def sandbox_command(checkout: Path, workdir: Path, *args: str, env: Mapping[str, str] | None = None,
                    timeout: float = 1800) -> subprocess.CompletedProcess[str]:
    """`python -m scripts.sandbox ARGS --workdir WORKDIR` of that checkout, with its own virtualenv (the door every
    release has: 0.1.0's, which later releases keep as an alias of `kimi-cluster sandbox`)."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("HYPERSTACK_", "PYTHONPATH"))}
    # The release's checkout has no parsers venv of its own: its fake front runs this checkout's real vLLM as the
    # render server (each release since 0.3.0 reads KIMI_PARSERS_VENV).
    environment.setdefault("KIMI_PARSERS_VENV", str(parsers_vllm().parents[1]))
    environment.update(env or {})
    environment["PYTHONUNBUFFERED"] = "1"
    return subprocess.run([str(checkout / ".venv" / "bin" / "python"), "-m", "scripts.sandbox", *args,
                           "--workdir", str(workdir)], cwd=checkout, env=environment, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)


def point_project_at_this_checkout(stacks: CliStacks) -> None:
    """The cluster project's Pulumi.yaml as this checkout's sandbox writes it (main and virtualenv here); the stack's
    config file, set by the release's up, is left as it is."""
    stack = stacks.cluster
    project = yaml.safe_load((REPO_ROOT / "Pulumi.yaml").read_text())
    project["main"] = str(REPO_ROOT)
    project.setdefault("runtime", {}).setdefault("options", {})["virtualenv"] = sys.prefix
    (stack.project_dir / "Pulumi.yaml").write_text(
        f"# Written by kimi_cluster/sandbox/releases.py: the program runs from {REPO_ROOT}.\n" +
        yaml.safe_dump(project, sort_keys=False))


def preview_upgrade(workdir: Path, out: Any) -> dict[str, Any]:
    """`pulumi preview --diff --json` of the workdir's cluster stack with this checkout: its plan, whose `steps`
    list what would change (with `--diff`, what would not as well) and `changeSummary` counts each kind."""
    stacks = CliStacks(workdir, workdir / "secrets", out)
    point_project_at_this_checkout(stacks)
    stack = stacks.cluster
    text = stacks.cli().run(["preview", "--diff", "--json", "--stack", stack.name], cwd=stack.project_dir,
                            timeout=900)
    docs = [d for d in json_documents(text) if "steps" in d]
    if not docs:
        raise ReleaseError(f"pulumi preview --json printed no plan: {text[-800:]}")
    return docs[0]


def verdict(steps: Iterable[Mapping[str, Any]]) -> dict[str, list[str]]:
    """The preview's steps by what they do: `replaced` (a kept type replaced, deleted or created: must be empty),
    `updated` (resources updated in place, e.g. a node step that runs again), `other` (any other change)."""
    found: dict[str, list[str]] = {"replaced": [], "updated": [], "other": []}
    for step in steps:
        op, urn = str(step.get("op")), str(step.get("urn"))
        if op in ("same", "read", "refresh"):
            continue
        type_ = urn.split("::")[-2].split("$")[-1].removeprefix("pulumi-python:dynamic/") if "::" in urn else ""
        name = f"{type_} {urn.rsplit('::', 1)[-1]} ({op}{_keys(step)})"
        if type_ in KEPT_TYPES and op in REPLACING:
            found["replaced"].append(name)
        elif op == "update":
            found["updated"].append(name)
        else:
            found["other"].append(name)
    return found


def steps_run_again(changelog: str, version: str, keys: Iterable[str] = ()) -> tuple[str, ...]:
    """The node steps the changelog's entry for `version` says an upgrade runs again on a stack that sets `keys`:
    the backticked names of its "Steps that run again:" paragraph before its first "with" clause (every stack's),
    and those of each "with `key` ...: names" clause (after a semicolon) that names one of `keys`; what stands in
    parentheses is an aside, not a name."""
    return _named_steps(changelog, version, "Steps that run again:", keys)


def steps_added(changelog: str, version: str, keys: Iterable[str] = ()) -> tuple[str, ...]:
    """The node steps an upgrade creates on a stack that sets `keys`: the "Steps added:" paragraph, read as
    `steps_run_again` reads its own."""
    return _named_steps(changelog, version, "Steps added:", keys)


def _named_steps(changelog: str, version: str, heading: str, keys: Iterable[str]) -> tuple[str, ...]:
    entry = changelog.split(f"\n## {version}\n", 1)[1].split("\n## ", 1)[0]
    if heading not in entry:
        return ()
    paragraph = entry.split(heading, 1)[1].split("\n\n", 1)[0]
    while re.search(r"\([^()]*\)", paragraph):  # an aside names paths, units and reasons, never a step
        paragraph = re.sub(r"\([^()]*\)", "", paragraph)
    every, *clauses = re.split(r"(?:^\s*|;\s*)with\s", paragraph)
    wanted = set(keys)
    names = _STEP_NAME.findall(every)
    for clause in clauses:
        head, _, body = clause.partition(":")
        if wanted & set(re.findall(r"`(\w+)`", head)):
            names += _STEP_NAME.findall(body)
    return tuple(dict.fromkeys(names))


# A step's name in backticks (the table's names are lower case with hyphens; a path or a key is not one).
_STEP_NAME = re.compile(r"`([a-z][a-z-]*)`")


def unexpected_updates(updated: Iterable[str], steps: Iterable[str]) -> list[str]:
    """The updated resources (as `verdict` names them) that are not a command of one of `steps`."""
    return [name for name in updated if not _is_step_command(name, steps)]


def unexpected_others(other: Iterable[str], added: Iterable[str]) -> list[str]:
    """The other changes (as `verdict` names them) that are not the creation of a command of one of `added`."""
    return [name for name in other if not (name.endswith(" (create)") and _is_step_command(name, added))]


def _is_step_command(name: str, steps: Iterable[str]) -> bool:
    """Whether `name` is the command of one of `steps`: named `...-<step>`, or as its table entry's wrap names it
    (the readiness wait's command is `<group>-ready-wait`)."""
    if not name.startswith("command:remote:Command "):
        return False
    resource = name.split(" ")[1]
    return any(resource.endswith(suffix) for step in steps for suffix in _command_suffixes(step))


def _command_suffixes(step: str) -> tuple[str, ...]:
    entry = BY_NAME.get(step)
    wrapped = entry.wrap.command.split("}", 1)[-1] if entry is not None and entry.wrap is not None else None
    return (f"-{step}",) + ((wrapped,) if wrapped else ())


def _keys(step: Mapping[str, Any]) -> str:
    keys = step.get("diffReasons") or sorted((step.get("detailedDiff") or {}).keys())
    return f": {', '.join(map(str, keys))}" if keys else ""


def describe(found: Mapping[str, list[str]]) -> str:
    return json.dumps(found, indent=1)
