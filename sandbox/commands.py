"""Performs pulumi-command `command:local:Command` and `command:remote:Command` resources for real on this machine.

Local commands run as the provider runs them; remote commands run locally instead of over SSH, each host in its own
directory (cwd and HOME) with stub tools first on PATH, so a sandbox can stand in for the GPU nodes.
"""

from __future__ import annotations

import os
import re
import secrets
import signal
import subprocess
import threading
from collections import defaultdict, deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from . import props
from .console import Console
from .providers import Call, Diff, ProviderError, changed_keys

_TAIL_LINES = 25
# After the command exits, a background process it started may still hold stdout open; don't wait on it forever.
_PIPE_DRAIN_SECONDS = 5.0
_HOST_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]*$")


@dataclass(frozen=True)
class NodeExecution:
    """How node (remote) commands are executed: locally, one directory per `connection.host`."""

    nodes_dir: Path
    path_prefix: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)

    def node_dir(self, host: str) -> Path:
        if not _HOST_NAME.match(host) or ".." in host:
            raise ProviderError(f"connection.host {host!r} cannot name a sandbox node directory")
        return self.nodes_dir / host

    def login(self, host: str, user: str | None = None) -> tuple[dict[str, str], Path]:
        """A fresh login-like environment and working directory, as an SSH session has, not the engine's own."""
        cwd = self.node_dir(host)
        cwd.mkdir(parents=True, exist_ok=True)
        user = str(user or os.environ.get("USER") or "root")
        env = {
            "HOME": str(cwd),
            "USER": user,
            "LOGNAME": user,
            "SHELL": "/bin/bash",
            "PATH": os.pathsep.join([*self.path_prefix, os.environ.get("PATH", os.defpath)]),
            "LANG": os.environ.get("LANG", "C.UTF-8"),
            "SANDBOX_NODE_HOST": host,
            "SANDBOX_NODE_DIR": str(cwd),
        }
        env.update(self.env)
        return env, cwd

    def run(self, connection: Any, command: str, stdin: str, timeout: float) -> tuple[int, str, str]:
        """One command on a node, as the engine runs the node steps (bash in the node's directory): the same
        interface as components.node_exec.SshRunner, so operator tools reach sandbox nodes through this setting."""
        env, cwd = self.login(str(connection.host), getattr(connection, "user", None))
        try:
            done = subprocess.run(["bash", "-c", command], cwd=cwd, env=env, input=stdin, capture_output=True,
                                  text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return 124, "", f"the command on {connection.host} did not finish within {timeout:g} s"
        return done.returncode, done.stdout, done.stderr

    def to_json(self) -> dict[str, Any]:
        return {"nodes_dir": str(self.nodes_dir), "path_prefix": list(self.path_prefix), "env": dict(self.env)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> NodeExecution:
        return cls(Path(data["nodes_dir"]), tuple(data.get("path_prefix") or ()), dict(data.get("env") or {}))


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = defaultdict(list)
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                stat = handle.read()
        except OSError:
            continue
        # The command name may hold spaces and parentheses; the parent pid is the 2nd field after the last ')'.
        children[int(stat.rsplit(")", 1)[1].split()[1])].append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def kill_tree(pid: int) -> None:
    """Kill a command and everything it started (they share the engine's process group, so no killpg)."""
    for victim in [pid, *_descendants(pid)]:
        try:
            os.kill(victim, signal.SIGKILL)
        except ProcessLookupError:
            pass


class CommandRunner:
    """The pulumi-command provider's behaviour (v1.x): create/update/delete scripts, stdin, env, triggers.

    As in pulumi-command: only `triggers` replace; any other changed input (the script, stdin, and the whole
    `connection`) is an update, which re-runs `create` when there is no `update` script; customTimeouts never stop
    a running command.
    """

    def __init__(
        self,
        kind: str,
        console: Console,
        project_dir: Path,
        nodes: NodeExecution | None = None,
    ) -> None:
        if kind not in ("local", "remote"):
            raise ValueError(kind)
        if kind == "remote" and nodes is None:
            raise ValueError("remote commands need a NodeExecution")
        self._kind = kind
        self._console = console
        self._project_dir = project_dir
        self._nodes = nodes
        self._running: set[subprocess.Popen[bytes]] = set()
        self._running_lock = threading.Lock()

    # -- provider protocol -----------------------------------------------------------------------------------

    def check(self, call: Call, olds: dict[str, Any], news: dict[str, Any]) -> dict[str, Any]:
        checked = dict(news)
        # The provider's schema default, applied at check time as pulumi-go-provider's infer does.
        checked.setdefault("addPreviousOutputInEnv", True)
        plain = props.strip_secrets(checked)
        if self._kind == "remote":
            connection = plain.get("connection") or {}
            if not isinstance(connection, dict) or not connection.get("host"):
                raise ProviderError("connection.host is required")
            assert self._nodes is not None
            self._nodes.node_dir(str(connection["host"]))
        else:
            for unsupported in ("assetPaths", "archivePaths"):
                if plain.get(unsupported):
                    raise ProviderError(f"{unsupported} is not supported by the sandbox engine")
        return checked

    def diff(self, call, old_inputs, old_outputs, news, ignore_changes) -> Diff:
        keys = [k for k in changed_keys(old_inputs, news) if k not in ignore_changes]
        # `triggers` is replaceOnChanges in the provider schema; everything else re-runs update (or create).
        return Diff(changes=bool(keys), replaces=["triggers"] if "triggers" in keys else [])

    def create(self, call: Call, inputs: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        resource_id = f"{call.name}{secrets.token_hex(4)}"
        script = props.strip_secrets(inputs.get("create"))
        stdout, stderr = ("", "")
        if script:
            stdout, stderr = self._run(call, "create", script, inputs, previous=None)
        return resource_id, {**inputs, "stdout": stdout, "stderr": stderr}

    def update(self, call, old_inputs, old_outputs, news, ignore_changes) -> dict[str, Any]:
        previous = (props.strip_secrets(old_outputs.get("stdout")) or "",
                    props.strip_secrets(old_outputs.get("stderr")) or "")
        script = props.strip_secrets(news.get("update")) or props.strip_secrets(news.get("create"))
        stdout, stderr = previous
        if script:
            op = "update" if props.strip_secrets(news.get("update")) else "create (as update)"
            stdout, stderr = self._run(call, op, script, news, previous=previous)
        return {**news, "stdout": stdout, "stderr": stderr}

    def delete(self, call: Call, inputs: dict[str, Any], outputs: dict[str, Any]) -> None:
        values = outputs or inputs
        script = props.strip_secrets(values.get("delete"))
        if script:
            previous = (props.strip_secrets(values.get("stdout")) or "",
                        props.strip_secrets(values.get("stderr")) or "")
            self._run(call, "delete", script, values, previous=previous)

    # -- execution -------------------------------------------------------------------------------------------

    def kill_all(self) -> None:
        with self._running_lock:
            running = list(self._running)
        for proc in running:
            kill_tree(proc.pid)

    def _environment(self, plain: dict[str, Any], previous: tuple[str, str] | None) -> tuple[dict[str, str], Path]:
        if self._kind == "local":
            env = dict(os.environ)
            cwd = Path(plain["dir"]) if plain.get("dir") else self._project_dir
            if not cwd.is_absolute():
                cwd = self._project_dir / cwd
        else:
            assert self._nodes is not None
            connection = plain.get("connection") or {}
            env, cwd = self._nodes.login(str(connection["host"]), connection.get("user"))
        env.update({str(k): str(v) for k, v in (plain.get("environment") or {}).items()})
        if previous is not None and plain.get("addPreviousOutputInEnv", True):
            if previous[0]:
                env["PULUMI_COMMAND_STDOUT"] = previous[0]
            if previous[1]:
                env["PULUMI_COMMAND_STDERR"] = previous[1]
        return env, cwd

    def _run(
        self, call: Call, op: str, script: str, values: dict[str, Any], previous: tuple[str, str] | None
    ) -> tuple[str, str]:
        plain = props.strip_secrets(values)
        env, cwd = self._environment(plain, previous)
        # As the provider runs them: a local command under its `interpreter` (default /bin/sh -c, so bashisms
        # fail here as they would for real); a node command under the nodes' login shell, bash.
        if self._kind == "remote":
            argv = ["bash", "-c", script]
        else:
            argv = [*(plain.get("interpreter") or ["/bin/sh", "-c"]), script]
        stdin_text = plain.get("stdin") or ""
        logging = plain.get("logging") or "stdoutAndStderr"
        log_stdout = logging in ("stdout", "stdoutAndStderr")
        log_stderr = logging in ("stderr", "stdoutAndStderr")

        out_lines: list[str] = []
        err_lines: list[str] = []
        tail: deque[str] = deque(maxlen=_TAIL_LINES)
        tail_lock = threading.Lock()

        def pump(stream: IO[bytes], sink: list[str], echo: bool) -> None:
            for raw in iter(stream.readline, b""):
                text = raw.decode(errors="replace")
                sink.append(text)
                with tail_lock:
                    tail.append(text.rstrip("\n"))
                if echo:
                    self._console.line(f"    {call.name} | {text.rstrip()}")

        try:
            proc = subprocess.Popen(
                argv, cwd=cwd, env=env,
                stdin=subprocess.PIPE if stdin_text else subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            )
        except OSError as exc:
            raise ProviderError(f"{op} command could not start: {exc}") from None
        with self._running_lock:
            self._running.add(proc)
        try:
            readers = [
                threading.Thread(target=pump, args=(proc.stdout, out_lines, log_stdout), daemon=True),
                threading.Thread(target=pump, args=(proc.stderr, err_lines, log_stderr), daemon=True),
            ]
            for reader in readers:
                reader.start()
            if stdin_text:
                threading.Thread(target=self._feed, args=(proc, stdin_text), daemon=True).start()
            # No deadline here, as in pulumi-command: customTimeouts bound only its SSH dial, and a running command
            # is never stopped by them. A hung command hangs the run until it ends by itself (a node step's own
            # deadline, see components.node.remote_command_text) or the engine is stopped (kill_all).
            code = proc.wait()
            for reader in readers:
                reader.join(timeout=_PIPE_DRAIN_SECONDS)
        finally:
            with self._running_lock:
                self._running.discard(proc)
        if code != 0:
            with tail_lock:
                last = "\n".join(tail) or "(no output)"
            reason = f"killed by signal {-code}" if code < 0 else f"exited with code {code}"
            raise ProviderError(f"{op} command {reason}; last output:\n{last}")
        return "".join(out_lines).removesuffix("\n"), "".join(err_lines).removesuffix("\n")

    @staticmethod
    def _feed(proc: subprocess.Popen[bytes], text: str) -> None:
        assert proc.stdin is not None
        try:
            proc.stdin.write(text.encode())
            proc.stdin.close()
        except (BrokenPipeError, OSError):
            # The command stopped reading; its exit status tells the story.
            pass
