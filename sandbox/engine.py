"""The sandbox engine: `pulumi up` and `pulumi destroy` of a real Pulumi Python program on one machine, no Pulumi CLI.

`Engine` is what the child process `python -m sandbox.engine up|destroy` runs; sandbox/engine_client.py starts it
(`run_up`, `run_destroy`, `run_child`), and its names are re-exported here for the callers that import them from
this module.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import signal
import sys
import time
import traceback
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pulumi

from . import props
from .commands import CommandRunner, NodeExecution
from .config import ConfigError, Project, StackConfig, load_project, load_stack_config
from .console import Console, indent_rest
from .dynamic_host import DynamicProviderHost
from .engine_client import (
    DEFAULT_DEADLINE_S,
    DEFAULT_OPERATION_TIMEOUT_S,
    DEFAULT_PARALLEL,
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    DeploymentFailed,
    DestroyResult,
    EngineSettings,
    SandboxError,
    UpResult,
    _settings,
    run_child,
    run_destroy,
    run_up,
    spawn,
)
from .monitor import EngineLog, SandboxMonitor
from .program import ProgramTimeout, run_program
from .providers import DYNAMIC_PREFIX, Registry
from .state import StateError, StateFile
from .steps import Deployment, StepFailed, StepSkipped

# The caller's names live in engine_client; kept importable from here, where callers and tests have found them.
__all__ = ["DeploymentFailed", "DestroyResult", "Engine", "EngineSettings", "SandboxError", "UpResult", "main",
           "run_child", "run_destroy", "run_up", "spawn"]

# ---------------------------------------------------------------------------------------------------------------
# The engine (runs in the child process)
# ---------------------------------------------------------------------------------------------------------------


class Engine:
    def __init__(self, settings: EngineSettings, console: Console) -> None:
        self._settings = settings
        self._console = console
        self._host: DynamicProviderHost | None = None
        self._runners: list[CommandRunner] = []

    # -- shared setup ----------------------------------------------------------------------------------------

    def _load(self) -> tuple[Project, StackConfig]:
        project = load_project(self._settings.project_dir)
        config = load_stack_config(
            project, self._settings.stack, self._settings.config_overrides, self._settings.secret_overrides
        )
        self._console.learn(config.wire())
        return project, config

    @contextmanager
    def _exclusive(self) -> Iterator[None]:
        self._settings.workdir.mkdir(parents=True, exist_ok=True)
        with open(self._settings.workdir / ".lock", "w") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise SandboxError(f"{self._settings.workdir}: another sandbox engine is running on it") from None
            yield

    def _open_state(self, project: Project) -> StateFile:
        state = StateFile.open(self._settings.state_path, project.name, self._settings.stack)
        for res in state.snapshot():
            self._console.learn(res.inputs)
            self._console.learn(res.outputs)
        for pending in state.take_pending_operations():
            self._console.warn(
                f"the previous run was interrupted during {pending['op']} of {pending['type']} "
                f"{pending['urn'].rsplit('::', 1)[-1]!r}; it may have been partly done and will be retried"
            )
        return state

    def _deployment(self, project: Project, config: StackConfig, state: StateFile) -> Deployment:
        settings = self._settings
        self._host = DynamicProviderHost(project.program_dir, project.name, settings.stack, config, self._console)
        nodes = NodeExecution(settings.workdir / "nodes", tuple(settings.node_path_prefix), dict(settings.node_env))
        local = CommandRunner("local", self._console, project.program_dir)
        remote = CommandRunner("remote", self._console, project.program_dir, nodes)
        self._runners = [local, remote]
        host = self._host
        registry = Registry(dynamic=lambda: host, local_commands=lambda: local, remote_commands=lambda: remote)
        return Deployment(state, registry, self._console, settings.operation_timeout, settings.parallel)

    def _close(self) -> None:
        for runner in self._runners:
            runner.kill_all()
        if self._host is not None:
            self._host.close()

    def abort(self) -> None:
        """On a signal: stop running commands and the provider host at once; completed steps are already saved."""
        for runner in self._runners:
            runner.kill_all()
        if self._host is not None:
            self._host.kill()

    def _summary(self, deployment: Deployment, started: float) -> None:
        c = deployment.counts
        self._console.line(
            f"Resources: {c['create']} created, {c['update']} updated, {c['replace']} replaced, "
            f"{c['delete']} deleted, {c['same']} unchanged. Duration: {time.monotonic() - started:.1f}s"
        )

    @staticmethod
    def _outcome(ok: bool, deployment: Deployment | None, error: str | None = None) -> dict[str, Any]:
        return {
            "ok": ok,
            "counts": dict(deployment.counts) if deployment else {},
            "failures": [f.describe() for f in deployment.failures] if deployment else [],
            "error": error,
        }

    # -- up --------------------------------------------------------------------------------------------------

    def up(self) -> dict[str, Any]:
        started = time.monotonic()
        project, config = self._load()
        with self._exclusive():
            state = self._open_state(project)
            deployment = self._deployment(project, config, state)
            assert self._host is not None
            # Started here, on the main thread, so the host's parent-death signal is tied to a thread that lives
            # as long as the engine; it is connected to lazily, on the first dynamic resource.
            self._host.start()
            try:
                return self._up(project, config, state, deployment, started)
            finally:
                self._close()

    def _up(
        self, project: Project, config: StackConfig, state: StateFile, deployment: Deployment, started: float
    ) -> dict[str, Any]:
        """The phases of an update: run the program (registering performs each step), settle, report."""
        self._console.line(f"Updating {project.name}/{self._settings.stack} with the sandbox engine "
                           f"(state: {state.path})")
        run = self._run_program(project, config, deployment)
        # After a clean run only: delete what the program no longer declares, save the outputs.
        ok = run.ok(deployment) and deployment.finish_up()
        self._report_up(ok, run, state, deployment, started)
        return self._outcome(ok, deployment, self._console.mask(run.error) if run.error else None)

    def _run_program(self, project: Project, config: StackConfig, deployment: Deployment) -> _ProgramRun:
        """Phase 1: the program runs to its end; then wait for steps still running (after a program error)."""
        settings = self._settings
        refs = {name: Path(where) for name, where in settings.stack_references.items()}
        monitor = SandboxMonitor(deployment, project.name, settings.stack, self._console, refs)
        run = _ProgramRun(EngineLog(self._console))

        def drain() -> None:
            run.drained = deployment.drain(settings.operation_timeout + 120)

        try:
            run_program(project, settings.stack, config, monitor, run.log, settings.parallel, settings.deadline,
                        before_close=drain)
        except Exception as exc:  # noqa: BLE001 - reported below, the run fails
            run.program_error = exc
        if run.program_failed:
            assert run.program_error is not None
            self._report_program_error(run.program_error, project.program_dir)
        if not run.drained:
            self._console.error("some resource steps were still running at the deadline; their results are lost")
        return run

    def _report_up(self, ok: bool, run: _ProgramRun, state: StateFile, deployment: Deployment,
                   started: float) -> None:
        """Phase 2: outputs on success, each failure and its reason otherwise, and the summary line."""
        if not run.ok(deployment):
            leftovers = [r for r in state.snapshot() if r.delete or r.urn not in set(deployment.registered)]
            if leftovers:
                self._console.line(f"  (not deleting {len(leftovers)} resource(s) the program no longer declares: "
                                   "the update failed)")
        if ok:
            outputs = state.outputs
            if outputs:
                self._console.line("Outputs:")
                for key in sorted(outputs):
                    self._console.line(f"    {key}: {props.render(outputs[key])}")
        self._summary(deployment, started)
        if not ok:
            self._console.error("update failed")
            for failure in deployment.failures:
                self._console.line(indent_rest(f"    {failure.describe()}", "      "))
            if run.error:
                self._console.line(f"    {run.error}")

    def _report_program_error(self, exc: BaseException, program_dir: Path) -> None:
        if isinstance(exc, (pulumi.RunError, ProgramTimeout)):
            self._console.error(str(exc))
            return
        # Start the traceback at the program's own code: the runtime and engine frames above it are noise.
        frames = traceback.extract_tb(exc.__traceback__)
        first = next((i for i, f in enumerate(frames) if f.filename.startswith(str(program_dir))), 0)
        lines = ["Traceback (most recent call last):\n", *traceback.format_list(frames[first:]),
                 *traceback.format_exception_only(exc)]
        self._console.error("the program raised an exception:")
        for line in "".join(lines).rstrip().splitlines():
            self._console.line(f"    {line}")

    # -- destroy ---------------------------------------------------------------------------------------------

    def destroy(self) -> dict[str, Any]:
        started = time.monotonic()
        project, config = self._load()
        with self._exclusive():
            state = self._open_state(project)
            deployment = self._deployment(project, config, state)
            self._console.line(
                f"Destroying {project.name}/{self._settings.stack} with the sandbox engine (state: {state.path})"
            )
            resources = state.snapshot()
            try:
                if self._host is not None and any(r.type.startswith(DYNAMIC_PREFIX) for r in resources):
                    self._host.start()
                ok = deployment.destroy()
                if not resources:
                    self._console.line("  nothing to destroy")
                    state.save()
                self._summary(deployment, started)
                if not ok:
                    self._console.error("destroy failed; what is left is still in the state file")
                    for failure in deployment.failures:
                        self._console.line(indent_rest(f"    {failure.describe()}", "      "))
                return self._outcome(ok, deployment)
            finally:
                self._close()


@dataclass
class _ProgramRun:
    """How the program run of an `up` ended: its error (if any), logged errors, whether every step finished."""

    log: EngineLog
    program_error: BaseException | None = None
    drained: bool = True

    @property
    def program_failed(self) -> bool:
        """The program itself failed (not just a failed step surfacing through the SDK, already reported)."""
        return self.program_error is not None and not _caused_by_step(self.program_error)

    def ok(self, deployment: Deployment) -> bool:
        return self.program_error is None and not deployment.failures and not self.log.errors and self.drained

    @property
    def error(self) -> str | None:
        """One line for the outcome: why the run failed beyond its failed steps."""
        if self.program_failed:
            assert self.program_error is not None
            return f"the program failed: {_one_line(self.program_error)}"
        if not self.drained:
            return "steps still running at the deadline"
        if self.log.errors:
            return f"the program logged an error: {self.log.errors[0].splitlines()[0] if self.log.errors[0] else ''}"
        return None


def _caused_by_step(exc: BaseException) -> bool:
    """Whether a program error is just a failed/skipped step surfacing through the SDK (already reported)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, (StepFailed, StepSkipped)):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[-1] if text else ''}"


# ---------------------------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------------------------


def _pairs(values: Sequence[str] | None, flag: str) -> dict[str, str]:
    pairs: dict[str, str] = {}
    for item in values or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SandboxError(f"{flag} expects KEY=VALUE, got {item!r}")
        pairs[key] = value
    return pairs


def _parse(argv: Sequence[str] | None) -> tuple[str, EngineSettings, Path | None]:
    parser = argparse.ArgumentParser(prog="python -m sandbox.engine", description=__doc__)
    parser.add_argument("operation", choices=["up", "destroy"])
    parser.add_argument("--project-dir", help="directory holding Pulumi.yaml")
    parser.add_argument("--stack", help="stack name (reads Pulumi.<stack>.yaml)")
    parser.add_argument("--workdir", help="where state.json and nodes/<host>/ live")
    parser.add_argument("--config", action="append", metavar="KEY=VALUE", help="config override (repeatable)")
    parser.add_argument("--secret", action="append", metavar="KEY=VALUE", help="secret config override (repeatable)")
    parser.add_argument("--node-path", action="append", metavar="DIR", help="prefix PATH of node commands")
    parser.add_argument("--node-env", action="append", metavar="KEY=VALUE", help="extra env of node commands")
    parser.add_argument("--stack-ref", action="append", metavar="NAME=WORKDIR", help="where a referenced stack lives")
    parser.add_argument("--parallel", type=int, default=DEFAULT_PARALLEL)
    parser.add_argument("--operation-timeout", type=float, default=DEFAULT_OPERATION_TIMEOUT_S,
                        help="seconds the engine waits on one provider operation (never cuts it off)")
    parser.add_argument("--deadline", type=float, default=DEFAULT_DEADLINE_S,
                        help="seconds for the whole program run")
    parser.add_argument("--request", metavar="FILE", help="settings as JSON ('-' for stdin) instead of the flags")
    parser.add_argument("--result-file", metavar="FILE", help="write the outcome as JSON here")
    args = parser.parse_args(argv)
    result_file = Path(args.result_file) if args.result_file else None
    if args.request:
        text = sys.stdin.read() if args.request == "-" else Path(args.request).read_text()
        return args.operation, EngineSettings.from_json(json.loads(text)), result_file
    if not (args.project_dir and args.stack and args.workdir):
        parser.error("--project-dir, --stack and --workdir are required (or --request)")
    settings = _settings(
        project_dir=args.project_dir, stack=args.stack, workdir=args.workdir,
        config_overrides=_pairs(args.config, "--config"), secret_overrides=_pairs(args.secret, "--secret"),
        node_path_prefix=args.node_path or (), node_env=_pairs(args.node_env, "--node-env"),
        stack_references=_pairs(args.stack_ref, "--stack-ref"), parallel=args.parallel,
        operation_timeout=args.operation_timeout, deadline=args.deadline,
    )
    return args.operation, settings, result_file


def main(argv: Sequence[str] | None = None) -> int:
    console = Console(sys.stdout)
    result_file: Path | None = None
    try:
        operation, settings, result_file = _parse(argv)
        engine = Engine(settings, console)

        def on_signal(signum: int, _frame: Any) -> None:
            engine.abort()
            console.error(f"interrupted by signal {signum}; completed steps are in the state file")
            os._exit(128 + signum)

        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, on_signal)
        outcome = engine.up() if operation == "up" else engine.destroy()
    except (SandboxError, ConfigError, StateError) as exc:
        console.error(str(exc))
        outcome = {"ok": False, "counts": {}, "failures": [], "error": console.mask(str(exc))}
        code = EXIT_USAGE
    else:
        code = EXIT_OK if outcome["ok"] else EXIT_FAILED
    if result_file is not None:
        result_file.write_text(json.dumps(outcome))
    sys.stdout.flush()
    # Threads the SDK or a provider left behind must not hold the process open.
    os._exit(code)


if __name__ == "__main__":
    main()
