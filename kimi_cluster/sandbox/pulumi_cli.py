"""The real Pulumi CLI, driven as a user drives it: login, stack init, config set, up, stack export, destroy.

Each sandbox workdir gets a Pulumi home of its own (`PULUMI_HOME`: its login, its workspace files), a file backend
in the workdir (`pulumi login file://<workdir>/state`), a passphrase in its secrets folder
(`PULUMI_CONFIG_PASSPHRASE_FILE`) and a project folder per stack: the checkout's `Pulumi.yaml` with `main` and the
virtualenv pointing back at the checkout, beside that stack's config file. `pulumi stack init` and `config set`
write there (the passphrase's salt, the secrets), so two sandboxes on one machine share nothing and the checkout's
`Pulumi.sandbox.yaml` is only ever read; the program itself runs from the checkout, as a user's does. Plugins come
from the machine's Pulumi home (`~/.pulumi/plugins`, where `scripts/pulumi-toolchain` installs pulumi-command), and
nothing is downloaded (`PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION`).

The CLI is the one `scripts/pulumi-toolchain` names: a `pulumi` on PATH at the pinned release or newer, else its
own build.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

REPO_ROOT = Path(__file__).resolve().parents[2]
TOOLCHAIN = REPO_ROOT / "scripts" / "pulumi-toolchain"
# A stack's organization in a file backend: its fully qualified name is organization/<project>/<stack>.
ORGANIZATION = "organization"
# The environment of the caller that must not reach the CLI: another backend, another passphrase, a real
# Hyperstack key or URL (the providers read HYPERSTACK_API_KEY before the stack's config).
_SCRUBBED_PREFIXES = ("PULUMI_", "HYPERSTACK_")


class PulumiError(Exception):
    """A CLI command failed; `output` is what it printed (secrets are never in it: they travel by stdin)."""

    def __init__(self, message: str, output: str = "", returncode: int = 1) -> None:
        super().__init__(message)
        self.output = output
        self.returncode = returncode

    def __str__(self) -> str:
        # What the CLI said is the reason: its last lines go with the message, so a door's traceback shows them.
        tail = self.output.strip().splitlines()[-12:]
        return "\n".join([super().__str__(), *("  " + line for line in tail)])


def toolchain_bin() -> Path:
    """The directory of `pulumi` and its Python language host: scripts/pulumi-toolchain's last line (it builds
    them once if this machine has none, about 8 minutes on 2 cores)."""
    # Its steps go straight to stderr: a first build runs for minutes and says what it is doing as it goes.
    done = subprocess.run(["bash", str(TOOLCHAIN), "--quiet"], stdout=subprocess.PIPE, text=True)
    if done.returncode != 0 or not done.stdout.strip():
        raise PulumiError(f"scripts/pulumi-toolchain failed ({done.returncode}): no Pulumi CLI to run", "",
                          done.returncode)
    return Path(done.stdout.strip().splitlines()[-1])


def end_session(sid: int) -> list[int]:
    """SIGKILL every process of session `sid` (Linux /proc), again until a pass finds none: a plugin's shim that was
    starting its Python when the scan passed it has forked by the next. Returns their pids."""
    killed: list[int] = []
    for _ in range(50):
        found = _kill_session_once(sid)
        if not found:
            break
        killed += found
        time.sleep(0.05)
    return killed


def _kill_session_once(sid: int) -> list[int]:
    killed = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        # After the command name: state, ppid, pgrp, session.
        if len(fields) > 3 and fields[3] == str(sid) and fields[0] != "Z":  # a zombie has ended already
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(entry), signal.SIGKILL)
                killed.append(int(entry))
    return killed


@dataclass(frozen=True)
class Stack:
    """One stack of one project: `project_dir` holds its Pulumi.yaml and config file, `program_dir` the program."""

    project_dir: Path
    name: str
    program_dir: Path

    @property
    def config_file(self) -> Path:
        return self.project_dir / f"Pulumi.{self.name}.yaml"


class PulumiCli:
    """`pulumi` for one sandbox workdir."""

    def __init__(self, workdir: Path, bin_dir: Path, passphrase_file: Path, out: TextIO | None = None) -> None:
        self.workdir = workdir
        self.bin_dir = bin_dir
        self.home = workdir / "pulumi-home"
        self.backend = f"file://{workdir / 'state'}"
        self.passphrase_file = passphrase_file
        self.out = out or sys.stdout
        self._current: subprocess.Popen[str] | None = None
        self.pid_file = workdir / "pulumi.pid"

    # -- environment --

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(_SCRUBBED_PREFIXES)}
        env.update({
            "PATH": os.pathsep.join([str(self.bin_dir), os.environ.get("PATH", os.defpath)]),
            "PULUMI_HOME": str(self.home),
            "PULUMI_CONFIG_PASSPHRASE_FILE": str(self.passphrase_file),
            "PULUMI_SKIP_UPDATE_CHECK": "true",
            # The Python language host lists the virtualenv's packages (`python -m pip list`) before every update and
            # destroy: pip's own check for a newer pip (a state file, at times PyPI) added 0.12 CPU-s to each
            # (farm-bench, 5 runs, medians 0.606 and 0.485 CPU-s).
            "PIP_DISABLE_PIP_VERSION_CHECK": "1",
            "PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION": "true",
            # No colours or progress redraws in logs and captured output.
            "PULUMI_SKIP_CONFIRMATIONS": "true",
            "NO_COLOR": "1",
        })
        env.update(extra or {})
        return env

    def prepare(self) -> None:
        """The workdir's Pulumi home, its plugins shared with the machine's, and the login to its file backend."""
        self.home.mkdir(parents=True, exist_ok=True)
        (self.workdir / "state").mkdir(parents=True, exist_ok=True)
        plugins = self.home / "plugins"
        machine_plugins = Path(os.environ.get("PULUMI_HOME") or Path.home() / ".pulumi") / "plugins"
        if not plugins.exists() and not plugins.is_symlink():
            machine_plugins.mkdir(parents=True, exist_ok=True)
            plugins.symlink_to(machine_plugins)
        if not self.logged_in():  # once a workdir, not once a command: each `pulumi` run is a CLI start
            self.run(["login", self.backend])

    def logged_in(self) -> bool:
        """This Pulumi home's current backend is the workdir's (`pulumi login` wrote it to credentials.json)."""
        try:
            credentials = json.loads((self.home / "credentials.json").read_text())
        except (OSError, ValueError):
            return False
        return isinstance(credentials, dict) and credentials.get("current") == self.backend

    # -- commands --

    def run(self, args: Sequence[str], *, cwd: Path | None = None, stdin: str | None = None,
            echo: bool = False, timeout: float = 600.0, env: Mapping[str, str] | None = None) -> str:
        """Run `pulumi ARGS`; returns its output (stdout and stderr together). `echo` streams it to `out` as it
        comes; SIGINT/SIGTERM to this process go on to the CLI, which then ends its operation cleanly."""
        argv = [str(self.bin_dir / "pulumi"), *args, "--non-interactive"]
        proc = subprocess.Popen(argv, cwd=cwd or REPO_ROOT, env=self.env(env), stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
        self._current = proc
        # Who is running: for a second sandbox command (refused while this one runs) and for a test's kill.
        self.pid_file.write_text(f"{proc.pid}\n")
        lines: list[str] = []
        assert proc.stdin is not None and proc.stdout is not None  # both are PIPE
        try:
            proc.stdin.write(stdin or "")
            proc.stdin.close()
        except BrokenPipeError:
            pass
        reader = threading.Thread(target=self._read, args=(proc.stdout, lines, echo), daemon=True)
        reader.start()
        deadline = time.monotonic() + timeout
        try:
            while proc.poll() is None:
                if time.monotonic() > deadline:
                    self.interrupt()
                    proc.wait(30)
                    raise PulumiError(f"pulumi {args[0]} did not finish within {timeout:g} s and was interrupted",
                                      "".join(lines), 124)
                time.sleep(0.05)
        except KeyboardInterrupt:
            # Ctrl-C in this process (no handler of the caller's took it): the CLI ends its operation cleanly.
            self.interrupt()
            proc.wait(120)
            raise
        finally:
            # A pulumi that was killed leaves its plugins running: a provider host would go on polling and end an
            # operation nobody waits for. They go with it. Pulumi starts each plugin in a process group of its own,
            # but all stay in the session this process gave it.
            end_session(proc.pid)
            reader.join(10)
            self._current = None
            self.pid_file.unlink(missing_ok=True)
        output = "".join(lines)
        if proc.returncode != 0:
            raise PulumiError(f"pulumi {' '.join(args[:2])} failed (exit {proc.returncode})", output,
                              proc.returncode)
        return output

    def _read(self, stream: Iterable[str], lines: list[str], echo: bool) -> None:
        for line in stream:
            lines.append(line)
            if echo:
                self.out.write(line)
                self.out.flush()

    def interrupt(self, sig: int = signal.SIGINT) -> None:
        """Pass Ctrl-C (or SIGTERM) on to the running CLI: it cancels its operation and saves what it did."""
        proc = self._current
        if proc is not None and proc.poll() is None:
            os.kill(proc.pid, sig)

    # -- stacks --

    def ensure_stack(self, stack: Stack) -> None:
        """`pulumi stack init` once (its project folder must exist)."""
        listed = self.run(["stack", "ls", "--json"], cwd=stack.project_dir)
        names = {entry.get("name") for entry in json.loads(listed or "[]")}
        if stack.name not in names and f"{ORGANIZATION}/{self.project_name(stack)}/{stack.name}" not in names:
            self.run(["stack", "init", stack.name], cwd=stack.project_dir)

    @staticmethod
    def project_name(stack: Stack) -> str:
        import yaml

        return str(yaml.safe_load((stack.project_dir / "Pulumi.yaml").read_text())["name"])

    def set_config(self, stack: Stack, values: Mapping[str, str], secrets: Mapping[str, str]) -> None:
        """`pulumi config set` each key; a secret's value goes by stdin, never on a command line (`ps` shows it)."""
        common = ["--stack", stack.name]
        if values:  # one call for all plain values: one write of the config file
            args = ["config", "set-all", *common]
            for key, value in sorted(values.items()):
                args += ["--plaintext", f"{key}={value}"]
            self.run(args, cwd=stack.project_dir)
        for key, value in sorted(secrets.items()):
            self.run(["config", "set", key, "--secret", *common], cwd=stack.project_dir, stdin=value)

    def up(self, stack: Stack, *, echo: bool, timeout: float, parallel: int | None = None,
           expect_no_changes: bool = False, preview: bool = True) -> str:
        """`pulumi up --yes`; `expect_no_changes`: with --expect-no-changes, which applies what changed and then
        fails, and --json, whose engine events name each change; `preview=False`: --skip-preview (the program runs
        once, not twice: the update's own diff says what it changes, the preview would only say it first)."""
        args = ["up", "--yes", "--stack", stack.name]
        if not preview:
            args.append("--skip-preview")
        if parallel:
            args += ["--parallel", str(parallel)]
        if expect_no_changes:
            args += ["--expect-no-changes", "--json"]
        return self.run(args, cwd=stack.project_dir, echo=echo, timeout=timeout)

    def destroy(self, stack: Stack, *, echo: bool, timeout: float) -> str:
        return self.run(["destroy", "--yes", "--stack", stack.name], cwd=stack.project_dir, echo=echo,
                        timeout=timeout)

    def remove_stack(self, stack: Stack) -> None:
        self.run(["stack", "rm", "--yes", "--stack", stack.name], cwd=stack.project_dir)

    def export(self, stack: Stack, show_secrets: bool = True) -> dict[str, Any]:
        """`pulumi stack export`: the deployment as a real stack's tools read it (kimi_cluster.cli.status does)."""
        args = ["stack", "export", "--stack", stack.name]
        if show_secrets:
            args.append("--show-secrets")
        text = self.run(args, cwd=stack.project_dir)
        doc = json.loads(text[text.index("{"):])
        return doc if isinstance(doc, dict) else {}

    def outputs(self, stack: Stack) -> dict[str, Any]:
        text = self.run(["stack", "output", "--json", "--show-secrets", "--stack", stack.name],
                        cwd=stack.project_dir)
        doc = json.loads(text[text.index("{"):]) if "{" in text else {}
        return doc if isinstance(doc, dict) else {}
