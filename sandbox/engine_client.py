"""The caller's side of the sandbox engine: its settings, and running it in a child process to its end.

`run_up`/`run_destroy` (and `run_child`, for callers that print as it goes) start `python -m sandbox.engine
up|destroy` (sandbox/engine.py) and read back its result. The Pulumi runtime is process-global, so the engine always
runs in a child; this side imports none of it, so a caller such as `scripts/sandbox.py` starts without the SDK.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .state import plain_outputs, read_outputs

_REPO_ROOT = Path(__file__).resolve().parent.parent
STATE_FILE = "state.json"

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2

# The engine's defaults, declared once (EngineSettings, run_up/run_destroy and the command line use these).
DEFAULT_PARALLEL = 64  # resource steps at once (the Pulumi CLI's --parallel default is unbounded; 64 is plenty)
# The engine's own patience for one provider operation (waiting out steps still running after a program error, or
# a stuck delete). No provider call or command is cut off at it: the real engine sets no deadline on either.
DEFAULT_OPERATION_TIMEOUT_S = 3600.0
DEFAULT_DEADLINE_S = 6 * 3600.0  # the whole program run of an `up`


class SandboxError(Exception):
    """The sandbox engine could not do what was asked; the message says what and why."""


class DeploymentFailed(SandboxError):
    """`up` or `destroy` failed; `failures` names each failed resource and its reason, `log` is the engine's output."""

    def __init__(self, message: str, failures: Sequence[str] = (), log: str = "") -> None:
        super().__init__(message)
        self.failures = list(failures)
        self.log = log


@dataclass(frozen=True)
class EngineSettings:
    project_dir: Path
    stack: str
    workdir: Path
    config_overrides: Mapping[str, str] = field(default_factory=dict)
    secret_overrides: Mapping[str, str] = field(default_factory=dict)
    # How node (remote) commands are executed: these directories first on PATH, plus this environment.
    node_path_prefix: tuple[str, ...] = ()
    node_env: Mapping[str, str] = field(default_factory=dict)
    # Stack reference name -> workdir of the sandbox run that holds that stack.
    stack_references: Mapping[str, str] = field(default_factory=dict)
    parallel: int = DEFAULT_PARALLEL
    operation_timeout: float = DEFAULT_OPERATION_TIMEOUT_S
    deadline: float = DEFAULT_DEADLINE_S

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["project_dir"], data["workdir"] = str(self.project_dir), str(self.workdir)
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> EngineSettings:
        values = dict(data)
        values["project_dir"] = Path(values["project_dir"])
        values["workdir"] = Path(values["workdir"])
        values["node_path_prefix"] = tuple(values.get("node_path_prefix") or ())
        return cls(**values)

    @property
    def state_path(self) -> Path:
        return self.workdir / STATE_FILE


@dataclass(frozen=True)
class UpResult:
    outputs: dict[str, Any]
    secret_outputs: frozenset[str]
    counts: dict[str, int]
    state_path: Path
    log: str


@dataclass(frozen=True)
class DestroyResult:
    counts: dict[str, int]
    state_path: Path
    log: str


def _settings(
    *,
    project_dir: str | Path,
    stack: str,
    workdir: str | Path,
    config_overrides: Mapping[str, Any] | None = None,
    secret_overrides: Mapping[str, Any] | None = None,
    node_path_prefix: Sequence[str | Path] = (),
    node_env: Mapping[str, str] | None = None,
    stack_references: Mapping[str, str | Path] | None = None,
    parallel: int = DEFAULT_PARALLEL,
    operation_timeout: float = DEFAULT_OPERATION_TIMEOUT_S,
    deadline: float = DEFAULT_DEADLINE_S,
) -> EngineSettings:
    """EngineSettings from caller-friendly values: paths resolved, structured config values as JSON."""
    return EngineSettings(
        project_dir=Path(project_dir).resolve(),
        stack=stack,
        workdir=Path(workdir).resolve(),
        config_overrides={k: v if isinstance(v, str) else json.dumps(v) for k, v in (config_overrides or {}).items()},
        secret_overrides={k: v if isinstance(v, str) else json.dumps(v) for k, v in (secret_overrides or {}).items()},
        node_path_prefix=tuple(str(Path(p).resolve()) for p in node_path_prefix),
        node_env=dict(node_env or {}),
        stack_references={k: str(Path(v).resolve()) for k, v in (stack_references or {}).items()},
        parallel=parallel,
        operation_timeout=operation_timeout,
        deadline=deadline,
    )


def spawn(operation: str, settings: EngineSettings, result_file: Path | None = None) -> subprocess.Popen[str]:
    """Start `python -m sandbox.engine <operation>` in its own session; settings go over stdin, off the command line.

    Output (stdout and stderr merged) is readable from the returned process's stdout.
    """
    if operation not in ("up", "destroy"):
        raise ValueError(f"operation must be 'up' or 'destroy', not {operation!r}")
    argv = [sys.executable, "-m", "sandbox.engine", operation, "--request", "-"]
    if result_file is not None:
        argv += ["--result-file", str(result_file)]
    env = dict(os.environ)
    # No PYTHONPATH of ours: the program and Pulumi's provider host import the project through its editable
    # install (pyproject.toml), as they must under the Pulumi CLI.
    env["PYTHONUNBUFFERED"] = "1"
    proc = subprocess.Popen(
        argv, cwd=_REPO_ROOT, env=env, text=True,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        # Its own session, so one killpg ends the engine and every command it runs.
        start_new_session=True,
    )
    assert proc.stdin is not None
    try:
        proc.stdin.write(json.dumps(settings.to_json()))
        proc.stdin.close()
    except BrokenPipeError:
        # The child died at start; its output and exit code tell why.
        pass
    return proc


def run_child(
    operation: str,
    settings: EngineSettings,
    *,
    echo: bool = True,
    out: Any = None,
    pid_file: Path | None = None,
    forward_signals: bool = False,
) -> tuple[dict[str, Any] | None, str]:
    """Run the engine child to its end; returns (its result, or None if it left none, and its whole output).

    `forward_signals` passes Ctrl-C/SIGTERM/SIGHUP on to the child, which runs in its own session and so would not
    see a terminal's Ctrl-C; `pid_file` names the running child for anyone who must wait for it.
    """
    out = out if out is not None else sys.stdout
    # The child enforces settings.deadline itself; this backstop covers a child that cannot.
    timeout = settings.deadline + settings.operation_timeout + 300
    with tempfile.TemporaryDirectory(prefix="sandbox-engine-") as tmp:
        result_file = Path(tmp) / "result.json"
        proc = spawn(operation, settings, result_file)
        if pid_file is not None:
            pid_file.parent.mkdir(parents=True, exist_ok=True)
            pid_file.write_text(f"{proc.pid}\n")
        lines: list[str] = []

        def pump() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                lines.append(line)
                if echo:
                    out.write(line)
                    out.flush()

        def forward(signum: int, _frame: Any) -> None:
            lines.append(f"sandbox: stopping the engine (signal {signum})\n")
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

        reader = threading.Thread(target=pump, name=f"sandbox-{operation}-output", daemon=True)
        reader.start()
        handlers = {}
        if forward_signals and threading.current_thread() is threading.main_thread():
            handlers = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
        try:
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(timeout=15)
                lines.append(f"sandbox: {operation} did not finish within {timeout:.0f} s and was stopped\n")
            reader.join(timeout=10)
        finally:
            for sig, handler in handlers.items():
                signal.signal(sig, handler)
            if pid_file is not None:
                pid_file.unlink(missing_ok=True)
        if not result_file.exists():
            lines.append(f"sandbox: the engine ended with exit code {proc.returncode} and no result\n")
            return None, "".join(lines)
        return json.loads(result_file.read_text()), "".join(lines)


def _run_child(operation: str, settings: EngineSettings, echo: bool) -> tuple[dict[str, Any], str]:
    result, log = run_child(operation, settings, echo=echo)
    if result is None:
        raise DeploymentFailed(f"sandbox {operation}: {log.splitlines()[-1].removeprefix('sandbox: ')}", log=log)
    return result, log


def _raise_failed(operation: str, result: dict[str, Any], log: str) -> None:
    reasons = list(result.get("failures") or [])
    if result.get("error"):
        reasons.append(result["error"])
    summary = "; ".join(reasons) if reasons else "see the log"
    raise DeploymentFailed(f"sandbox {operation} failed: {summary}", failures=reasons, log=log)


def run_up(
    project_dir: str | Path,
    stack: str,
    workdir: str | Path,
    config_overrides: Mapping[str, Any] | None = None,
    node_path_prefix: Sequence[str | Path] = (),
    node_env: Mapping[str, str] | None = None,
    *,
    secret_overrides: Mapping[str, Any] | None = None,
    stack_references: Mapping[str, str | Path] | None = None,
    parallel: int = DEFAULT_PARALLEL,
    operation_timeout: float = DEFAULT_OPERATION_TIMEOUT_S,
    deadline: float = DEFAULT_DEADLINE_S,
    echo: bool = True,
) -> UpResult:
    """`pulumi up` of the program in `project_dir` for `stack`, state in `<workdir>/state.json`.

    Raises DeploymentFailed (naming each failed resource and its reason) if anything failed.
    """
    settings = _settings(project_dir=project_dir, stack=stack, workdir=workdir, config_overrides=config_overrides,
                         secret_overrides=secret_overrides, node_path_prefix=node_path_prefix, node_env=node_env,
                         stack_references=stack_references, parallel=parallel,
                         operation_timeout=operation_timeout, deadline=deadline)
    result, log = _run_child("up", settings, echo)
    if not result.get("ok"):
        _raise_failed("up", result, log)
    outputs, secret_names = plain_outputs(read_outputs(settings.state_path))
    return UpResult(outputs, secret_names, dict(result.get("counts") or {}), settings.state_path, log)


def run_destroy(
    project_dir: str | Path,
    stack: str,
    workdir: str | Path,
    config_overrides: Mapping[str, Any] | None = None,
    *,
    secret_overrides: Mapping[str, Any] | None = None,
    parallel: int = DEFAULT_PARALLEL,
    operation_timeout: float = DEFAULT_OPERATION_TIMEOUT_S,
    deadline: float = DEFAULT_DEADLINE_S,
    echo: bool = True,
) -> DestroyResult:
    """`pulumi destroy`: delete all that `<workdir>/state.json` holds, dependents first, through the same providers."""
    settings = _settings(project_dir=project_dir, stack=stack, workdir=workdir, config_overrides=config_overrides,
                         secret_overrides=secret_overrides, parallel=parallel,
                         operation_timeout=operation_timeout, deadline=deadline)
    result, log = _run_child("destroy", settings, echo)
    if not result.get("ok"):
        _raise_failed("destroy", result, log)
    return DestroyResult(dict(result.get("counts") or {}), settings.state_path, log)
