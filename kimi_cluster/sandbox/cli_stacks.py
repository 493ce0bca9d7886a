"""The sandbox's two stacks (the cluster and its verification) under the real Pulumi CLI, in one workdir.

What the sandbox asks of an engine, answered by `pulumi`: up and destroy with a result (ok, counts, failures),
the resources and outputs of a stack, and an export with its secrets for `kimi_cluster.cli.status`. The file backend's
checkpoint (`state/.pulumi/stacks/<project>/<stack>.json`) is read directly for the resource list and the outputs
that need no secret in plain text: it is the CLI's own file, and reading it needs no process.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import sys
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TextIO

import yaml

from .pulumi_cli import PulumiCli, PulumiError, Stack, toolchain_bin
from .stack_secrets import KeptSecrets, ciphertexts, restore

REPO_ROOT = Path(__file__).resolve().parents[2]
VERIFICATION_DIR = REPO_ROOT / "verification"
STACK_NAME = "sandbox"
STACK_TYPE = "pulumi:pulumi:Stack"
# A secret in a checkpoint's values: {SIGNATURE_KEY: SECRET_SIGNATURE, "ciphertext": ...} (`Key` and `Secret` of
# sdk/go/common/resource/sig/sig.go in github.com/pulumi/pulumi, v3.259.0).
SIGNATURE_KEY = "4dabf18193072939515e22adb298388d"
SECRET_SIGNATURE = "1b47061264138c4ac30d75fd1eb44270"
# The CLI's summary lines: "    + 65 created", "    65 unchanged", "    - 65 deleted".
_COUNT = re.compile(r"^\s+[+~\-]?\s*(\d+) (created|updated|deleted|unchanged|replaced)\s*$")
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def _holds_secret(value: Any) -> bool:
    """Whether a checkpoint value is, or holds anywhere within it, a secret."""
    if isinstance(value, dict):
        return value.get(SIGNATURE_KEY) == SECRET_SIGNATURE or any(_holds_secret(v) for v in value.values())
    return isinstance(value, list) and any(_holds_secret(v) for v in value)


def _counts(output: str) -> dict[str, int]:
    names = {"created": "create", "updated": "update", "deleted": "delete", "unchanged": "same",
             "replaced": "replace"}
    counts: dict[str, int] = {}
    for line in output.splitlines():
        if m := _COUNT.match(_ANSI.sub("", line)):
            counts[names[m[2]]] = int(m[1])
    return counts


# A Diagnostics block's resource header ("  command:remote:Command (kimi-node0-ready):") and pulumi-command's
# quoting of the whole command it ran (Go's %q) after its exit status, which for a step is some 20 KB of base64.
_DIAGNOSTIC_HEADER = re.compile(r"^  (\S+) \((.+)\):$")
_RAN_COMMAND = re.compile(r': running "(?:[^"\\]|\\.)*":?')


def _message(lines: list[str]) -> str:
    """One error's text in a line: a Python traceback (the dynamic provider host sends the whole of it) by its last
    line without the exception's module path, a failed command without the command it ran."""
    text = [line.strip() for line in lines if line.strip()]
    if text and text[0].startswith("Traceback (most recent call last):"):
        last = text[-1]
        name, sep, rest = last.partition(": ")
        text = [rest if sep and re.fullmatch(r"[\w.]+", name) else last]
    return _RAN_COMMAND.sub("", "; ".join(text))


def failures(output: str) -> list[str]:
    """The errors of the CLI's Diagnostics, one line each, naming the resource, in the order it printed them (the
    stack's own "update failed" only when no resource said more)."""
    found: list[str] = []
    stack_errors: list[str] = []
    lines = [_ANSI.sub("", raw) for raw in output.splitlines()]
    start = next((i for i in range(len(lines) - 1, -1, -1) if lines[i].startswith("Diagnostics:")), None)
    if start is None:
        return [line.strip().removeprefix("error:").strip() for line in lines if line.strip().startswith("error:")]
    resource, error = "", None
    blocks: list[tuple[str, list[str]]] = []
    for line in lines[start + 1:]:
        if line and not line.startswith(" "):
            break  # the section ends at the next unindented line (Outputs:, Resources:)
        if header := _DIAGNOSTIC_HEADER.match(line):
            resource, error = f"{header[1]} '{header[2]}'", None
        elif line.startswith("    error: "):
            error = [line.removeprefix("    error: ")]
            blocks.append((resource, error))
        elif line.startswith("    ") and error is not None and not line.startswith("    warning: "):
            error.append(line)
        else:
            error = None
    for where, text in blocks:
        message = _message(text)
        if where.startswith("pulumi:pulumi:Stack"):
            stack_errors.append(message)
        elif (entry := f"{where}: {message}") not in found:
            found.append(entry)
    return found or [m for m in stack_errors if m] or ["the update failed (no error in its Diagnostics)"]


class CliStacks:
    """The real CLI for one sandbox workdir; `passphrase_file` guards its stacks' secrets."""

    def __init__(self, root: Path, secrets_dir: Path, out: TextIO) -> None:
        self.root = root
        self.secrets_dir = secrets_dir
        self.out = out
        self._cli: PulumiCli | None = None
        self.cluster = Stack(root / "projects" / "cluster", STACK_NAME, REPO_ROOT)
        self.verification = Stack(root / "projects" / "verification", STACK_NAME, VERIFICATION_DIR)

    # -- the CLI --

    @property
    def passphrase_file(self) -> Path:
        path = self.secrets_dir / "pulumi_passphrase"
        if not path.exists():
            self.secrets_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as handle:
                handle.write(secrets.token_urlsafe(32) + "\n")
        return path

    @property
    def kept_secrets(self) -> KeptSecrets:
        return KeptSecrets(self.secrets_dir, self.passphrase_file)

    def cli(self) -> PulumiCli:
        if self._cli is None:
            cli = PulumiCli(self.root, toolchain_bin(), self.passphrase_file, self.out)
            cli.prepare()
            self._cli = cli
        return self._cli

    # -- state, read from the backend's files --

    def checkpoint_path(self, stack: Stack) -> Path:
        project = PulumiCli.project_name(Stack(stack.program_dir, stack.name, stack.program_dir))
        return self.root / "state" / ".pulumi" / "stacks" / project / f"{stack.name}.json"

    def _latest(self, stack: Stack) -> dict[str, Any]:
        """The checkpoint's latest deployment (empty before the first up)."""
        path = self.checkpoint_path(stack)
        if not path.exists():
            return {}
        return (json.loads(path.read_text()).get("checkpoint") or {}).get("latest") or {}

    def resources(self, stack: Stack) -> list[dict[str, Any]]:
        """The stack's resources (the stack itself excluded), as its checkpoint holds them."""
        return [r for r in self._latest(stack).get("resources") or [] if r.get("type") != STACK_TYPE]

    def pending_operations(self, stack: Stack) -> list[dict[str, Any]]:
        return list(self._latest(stack).get("pending_operations") or [])

    def _checkpoint_outputs(self, stack: Stack) -> dict[str, Any]:
        """The stack's outputs as the checkpoint holds them: a secret one as an object signed as a secret."""
        stack_resource: dict[str, Any] = next(
            (r for r in self._latest(stack).get("resources") or [] if r.get("type") == STACK_TYPE), {})
        return dict(stack_resource.get("outputs") or {})

    def outputs(self, stack: Stack) -> tuple[dict[str, Any], frozenset[str]]:
        """(the stack's outputs in plain text, the names of those that are secrets)."""
        if not self.checkpoint_path(stack).exists():
            return {}, frozenset()
        cli = self.cli()
        shown = json.loads(cli.run(["stack", "output", "--json", "--show-secrets", "--stack", stack.name],
                                   cwd=stack.project_dir) or "{}")
        # Which are secrets, from the checkpoint (no second CLI start for the masked outputs).
        secret_names = frozenset(name for name, value in self._checkpoint_outputs(stack).items()
                                 if isinstance(value, dict) and value.get(SIGNATURE_KEY) == SECRET_SIGNATURE)
        return shown, secret_names

    def public_outputs(self, stack: Stack) -> tuple[dict[str, Any], frozenset[str]]:
        """(the stack's outputs, the names of those that hold a secret, each of those None): from the checkpoint,
        with no CLI start (some 0.4 CPU-seconds each), for the readers that need no secret in plain text."""
        held = self._checkpoint_outputs(stack)
        secret_names = frozenset(name for name, value in held.items() if _holds_secret(value))
        return {name: None if name in secret_names else value for name, value in held.items()}, secret_names

    @contextmanager
    def export_file(self, stack: Stack) -> Iterator[Path]:
        """`pulumi stack export --show-secrets` in a 0600 file of the secrets folder, removed afterwards."""
        doc = self.cli().export(stack, show_secrets=True)
        path = self.secrets_dir / f"export-{os.getpid()}-{threading.get_ident()}.json"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            with os.fdopen(fd, "w") as handle:
                json.dump(doc, handle)
            yield path
        finally:
            path.unlink(missing_ok=True)

    # -- operations --

    def _project(self, stack: Stack, base: Path | None) -> None:
        """The stack's project folder: the program's Pulumi.yaml, its `main` and virtualenv made absolute, and the
        stack's config file, the checkout's as it is now plus the salt of this stack's passphrase."""
        project = yaml.safe_load((stack.program_dir / "Pulumi.yaml").read_text())
        project["main"] = str(stack.program_dir)
        options = project.setdefault("runtime", {}).setdefault("options", {})
        # The interpreter running the sandbox is the project's virtualenv (scripts/venv.sh made it).
        options["virtualenv"] = sys.prefix
        stack.project_dir.mkdir(parents=True, exist_ok=True)
        (stack.project_dir / "Pulumi.yaml").write_text(
            "# Written by the sandbox (kimi_cluster/sandbox/cli_stacks.py) from the checkout's Pulumi.yaml: the\n"
            f"# program runs from {stack.program_dir}.\n" + yaml.safe_dump(project, sort_keys=False))
        salt = None
        if stack.config_file.exists():
            salt = (yaml.safe_load(stack.config_file.read_text()) or {}).get("encryptionsalt")
        text = base.read_text() if base is not None and base.exists() else "config: {}\n"
        stack.config_file.write_text(text + (f"encryptionsalt: {salt}\n" if salt else ""))

    def up(self, stack: Stack, base: Path | None, config: Mapping[str, str], secret_config: Mapping[str, str],
           *, echo: bool, timeout: float, expect_no_changes: bool = False, preview: bool = True) -> dict[str, Any]:
        """`pulumi up --yes` (with its preview unless `preview=False`) after `stack init` (once) and `config set` of
        every plain value and of each secret that changed (`expect_no_changes`: PulumiCli.up's)."""
        cli = self.cli()
        previous = ciphertexts(stack.config_file)
        self._project(stack, base)
        if not self.checkpoint_path(stack).exists():  # the file backend writes it at `stack init`
            cli.ensure_stack(stack)
        # A secret set before with the same value gets its ciphertext back (kimi_cluster/sandbox/stack_secrets.py).
        project = stack.project_dir.name
        kept = self.kept_secrets.unchanged(project, previous, secret_config) if previous else {}
        restore(stack.config_file, kept)
        cli.set_config(stack, config, {k: v for k, v in secret_config.items() if k not in kept})
        self.kept_secrets.remember(project, secret_config, stack.config_file)
        return self._operation(lambda: cli.up(stack, echo=echo, timeout=timeout,
                                              expect_no_changes=expect_no_changes, preview=preview))

    def unlock(self, stack: Stack) -> None:
        """`pulumi cancel`: a killed `pulumi` leaves the stack locked (the file backend keeps a lock file under
        state/.pulumi/locks), and every later up or destroy refuses until it goes. Harmless when there is none."""
        self.mend_cut_sidecars()
        try:
            self.cli().run(["cancel", "--yes", "--stack", stack.name], cwd=stack.project_dir)
        except PulumiError as err:
            self.out.write(f"pulumi cancel: {(failures(err.output) or [str(err)])[0]}\n")

    def mend_cut_sidecars(self) -> None:
        """Remove the file backend's metadata files that a killed `pulumi` cut short. The backend (gocloud.dev's
        fileblob, blob/fileblob/fileblob.go) writes a blob's `<name>.attrs` in place, then renames the new blob in
        over the old: killed between the two, the checkpoint is the old one and whole, but its `.attrs` is empty or
        partial, and every later command fails "failed to load checkpoint: EOF". An `.attrs` that is missing reads
        as no metadata (blob/fileblob/attrs.go `getAttrs`), so a cut one is removed."""
        state = self.root / "state" / ".pulumi"
        for sidecar in sorted(state.rglob("*.attrs")) if state.exists() else ():
            try:
                whole = isinstance(json.loads(sidecar.read_bytes()), dict)
            except ValueError:
                whole = False
            if not whole:
                sidecar.unlink()
                self.out.write(f"removed {sidecar.relative_to(self.root)}: cut short by a killed pulumi (the blob "
                               "beside it is whole)\n")

    def recover(self, stack: Stack) -> None:
        """What a user runs after an interrupted up: `pulumi cancel` (the stack's lock), then `pulumi refresh
        --clear-pending-creates`, which asks each provider whether what the interrupted up began exists."""
        cli = self.cli()
        self.unlock(stack)
        cli.run(["refresh", "--yes", "--clear-pending-creates", "--stack", stack.name], cwd=stack.project_dir,
                timeout=600)

    def destroy(self, stack: Stack, *, echo: bool, timeout: float) -> dict[str, Any]:
        if not self.checkpoint_path(stack).exists():
            return {"ok": True, "counts": {}, "failures": [], "output": ""}
        cli = self.cli()
        if not stack.config_file.exists():
            self._project(stack, None)
        if self.pending_operations(stack) or self.locked(stack):
            self.unlock(stack)
        return self._operation(lambda: cli.destroy(stack, echo=echo, timeout=timeout))

    def locked(self, stack: Stack) -> bool:
        locks = self.root / "state" / ".pulumi" / "locks"
        return locks.exists() and any(p.is_file() for p in locks.rglob("*.json"))

    def forget(self, stack: Stack) -> None:
        """After a destroy that left 0 resources: the stack and its config go (a new up starts a new one)."""
        if self.checkpoint_path(stack).exists():
            if self.resources(stack):
                raise PulumiError(f"stack {stack.name} of {stack.project_dir.name} still holds resources")
            self.cli().remove_stack(stack)
        stack.config_file.unlink(missing_ok=True)

    def logged_out(self) -> None:
        """The workdir's Pulumi home and backend were deleted (a destroy forgets them): the next command logs in
        again, as a user would after removing ~/.pulumi."""
        self._cli = None

    def _operation(self, run: Any) -> dict[str, Any]:
        interrupted: list[int] = []

        def forward(signum: int, _frame: Any) -> None:
            interrupted.append(signum)
            self.cli().interrupt(signal.SIGINT)

        handlers = {}
        if threading.current_thread() is threading.main_thread():
            handlers = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
        try:
            output = run()
        except PulumiError as err:
            return {"ok": False, "interrupted": bool(interrupted), "counts": _counts(err.output),
                    "failures": failures(err.output) or [str(err)], "output": err.output, "code": err.returncode}
        finally:
            for sig, handler in handlers.items():
                signal.signal(sig, handler)
        return {"ok": True, "interrupted": bool(interrupted), "counts": _counts(output), "failures": [],
                "output": output}
