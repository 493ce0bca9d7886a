"""Runs Pulumi's own Python dynamic provider host (`python -m pulumi.dynamic`) and drives it over gRPC.

Providers are unpickled from `__provider` and called in that separate process, as during a real `pulumi up`,
so a provider that only works inside the program's process fails here too.

The host needs no engine address: it serves the ResourceProvider gRPC service on a loopback port it prints on
stdout. It is launched with the program directory as cwd, as the real engine does, with PULUMI_PROJECT/PULUMI_STACK
set and no program config in its environment, and configured with the full namespaced stack config (the engine's
behaviour for dynamic providers since pulumi#17673). The providers it unpickles by reference are imported through
the project's editable install (pyproject.toml). Like the real engine, secrets are
stripped before each call because the host's Configure answers acceptSecrets=False, and outputs are re-marked
secret where the same-named input was secret.
"""

from __future__ import annotations

import ctypes
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import grpc
from pulumi.runtime.proto import provider_pb2, provider_pb2_grpc

from . import props
from .config import StackConfig
from .console import Console
from .providers import Call, Diff, ProviderError

# Same message limits the SDK uses, so large pickled providers pass.
_CHANNEL_OPTIONS = [("grpc.max_receive_message_length", 400 * 1024 * 1024),
                    ("grpc.max_send_message_length", 400 * 1024 * 1024)]

try:
    _LIBC: Any = ctypes.CDLL(None, use_errno=True)
except OSError:  # not Linux/glibc: the host is still ended by close() or a process-group kill
    _LIBC = None
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    # Runs in the forked child before exec: if the engine is killed outright, the host must not linger.
    if _LIBC is not None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "(no detail)"


# Set by the language host for the program only; a plugin process never sees the program's config through them.
_PROGRAM_ONLY_ENV = ("PULUMI_CONFIG", "PULUMI_CONFIG_SECRET_KEYS")
_INSTALL_HINT = ("the provider host imports each provider by its module name; install the project into the venv "
                 "the host runs from: .venv/bin/pip install -e .")


def host_environment(base: Mapping[str, str], project: str, stack: str) -> dict[str, str]:
    """The environment the engine starts the host with: the engine's own, plus project and stack, no config.

    The real engine passes a plugin only the config of its own package namespace (`pulumi-python` has none), so a
    provider that reads `pulumi.Config()` or PULUMI_CONFIG sees nothing; stack config arrives only through
    Configure. Stripping them here makes a provider that relies on them fail in the sandbox as it would for real.
    """
    env = {k: v for k, v in base.items() if k not in _PROGRAM_ONLY_ENV}
    env.update({"PULUMI_PROJECT": project, "PULUMI_STACK": stack, "PYTHONUNBUFFERED": "1"})
    return env


class DynamicProviderHost:
    """One host process per engine run: the SDK host caches each unpickled provider and configures it once."""

    def __init__(
        self,
        program_dir: Path,
        project: str,
        stack: str,
        config: StackConfig,
        console: Console,
        start_timeout: float = 60.0,
        python: str = sys.executable,
    ) -> None:
        self._program_dir = program_dir
        self._project = project
        self._stack = stack
        self._config = config
        self._console = console
        self._start_timeout = start_timeout
        self._python = python
        self._proc: subprocess.Popen[bytes] | None = None
        self._port: queue.Queue[str] = queue.Queue()
        self._stderr_tail: deque[str] = deque(maxlen=40)
        self._lock = threading.Lock()
        self._channel: grpc.Channel | None = None
        self._stub: provider_pb2_grpc.ResourceProviderStub | None = None

    # -- process ---------------------------------------------------------------------------------------------

    def start(self) -> None:
        """Launch the host without waiting for it; call from the main thread (the parent-death signal is per thread)."""
        if self._proc is not None:
            return
        env = host_environment(os.environ, self._project, self._stack)
        self._proc = subprocess.Popen(
            [self._python, "-u", "-m", "pulumi.dynamic"],
            cwd=self._program_dir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            preexec_fn=_die_with_parent,
        )
        threading.Thread(target=self._read_stdout, name="dynamic-host-stdout", daemon=True).start()
        threading.Thread(target=self._read_stderr, name="dynamic-host-stderr", daemon=True).start()

    def _read_stdout(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        first = True
        for raw in self._proc.stdout:
            line = raw.decode(errors="replace").rstrip("\n")
            if first:
                # The host's first line is its port; anything after is the providers' own prints.
                self._port.put(line.strip())
                first = False
            else:
                self._console.line(f"    [dynamic provider] {line}")

    def _read_stderr(self) -> None:
        assert self._proc is not None and self._proc.stderr is not None
        for raw in self._proc.stderr:
            line = raw.decode(errors="replace").rstrip("\n")
            self._stderr_tail.append(line)
            self._console.line(f"    [dynamic provider] {line}")

    def _exit_detail(self) -> str:
        code = self._proc.poll() if self._proc else None
        tail = "\n".join(self._stderr_tail)
        return f"dynamic provider host exited (code {code})" + (f"; its stderr ends:\n{tail}" if tail else "")

    def _connect(self) -> provider_pb2_grpc.ResourceProviderStub:
        with self._lock:
            if self._stub is not None:
                return self._stub
            self.start()
            deadline = time.monotonic() + self._start_timeout
            port = ""
            while not port:
                if self._proc is not None and self._proc.poll() is not None and self._port.empty():
                    raise ProviderError("the dynamic provider host did not start", self._exit_detail())
                try:
                    port = self._port.get(timeout=0.1)
                except queue.Empty:
                    if time.monotonic() > deadline:
                        raise ProviderError(
                            f"the dynamic provider host did not report its port within {self._start_timeout:.0f}s"
                        ) from None
            if not port.isdigit():
                raise ProviderError(f"the dynamic provider host printed {port!r} where its port was expected")
            channel = grpc.insecure_channel(f"127.0.0.1:{port}", options=_CHANNEL_OPTIONS)
            try:
                grpc.channel_ready_future(channel).result(timeout=max(1.0, deadline - time.monotonic()))
            except grpc.FutureTimeoutError:
                channel.close()
                raise ProviderError(f"the dynamic provider host on port {port} did not accept a connection") from None
            stub = provider_pb2_grpc.ResourceProviderStub(channel)
            config = self._config.wire()
            try:
                stub.Configure(
                    provider_pb2.ConfigureRequest(
                        variables={k: str(props.strip_secrets(v)) for k, v in config.items()},
                        args=props.json_to_struct(config),
                        acceptSecrets=True,
                        acceptResources=True,
                    ),
                    timeout=self._start_timeout,
                )
            except grpc.RpcError as exc:
                channel.close()
                raise ProviderError(f"configuring the dynamic provider host failed: {exc.details()}") from None
            self._channel, self._stub = channel, stub
            return stub

    def close(self) -> None:
        with self._lock:
            if self._channel is not None:
                self._channel.close()
                self._channel = self._stub = None
            if self._proc is not None and self._proc.poll() is None:
                self._proc.terminate()
                try:
                    self._proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    self._proc.kill()
                    self._proc.wait(timeout=5)

    def kill(self) -> None:
        """For signal handlers: no locks, no waiting."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.kill()

    # -- calls -----------------------------------------------------------------------------------------------

    def _invoke(self, what: str, call: Call, method_name: str, request: Any) -> Any:
        stub = self._connect()
        try:
            # No gRPC deadline: the real engine sets none on a provider call (it passes customTimeouts in the
            # request's `timeout` field, which the Python host ignores). Providers bound their own waits.
            return getattr(stub, method_name)(request)
        except grpc.RpcError as exc:
            code = exc.code()
            if code == grpc.StatusCode.UNAVAILABLE:
                raise ProviderError(self._exit_detail()) from None
            details = exc.details() or str(code)
            # The host sends the provider's traceback; its last line is the exception, the reason.
            reason = _last_line(details)
            if "ModuleNotFoundError" in reason:
                reason = f"{reason} ({_INSTALL_HINT})"
            raise ProviderError(reason, details) from None

    def check(self, call: Call, olds: dict[str, Any], news: dict[str, Any]) -> dict[str, Any]:
        resp = self._invoke("check", call, "Check", provider_pb2.CheckRequest(
            urn=call.urn, name=call.name, type=call.type,
            olds=props.json_to_struct(props.strip_secrets(olds)),
            news=props.json_to_struct(props.strip_secrets(news)),
            randomSeed=os.urandom(32),
        ))
        if resp.failures:
            reasons = "; ".join(f"{f.property or '(resource)'}: {f.reason}" for f in resp.failures)
            raise ProviderError(f"invalid inputs: {reasons}")
        return props.annotate_secrets(props.struct_to_json(resp.inputs), news)

    def diff(self, call, old_inputs, old_outputs, news, ignore_changes) -> Diff:
        resp = self._invoke("diff", call, "Diff", provider_pb2.DiffRequest(
            id=call.id, urn=call.urn, name=call.name, type=call.type,
            olds=props.json_to_struct(props.strip_secrets(old_outputs)),
            news=props.json_to_struct(props.strip_secrets(news)),
            old_inputs=props.json_to_struct(props.strip_secrets(old_inputs)),
            ignoreChanges=ignore_changes,
        ))
        if resp.changes == provider_pb2.DiffResponse.DIFF_UNKNOWN:
            changes: bool | None = None
        else:
            changes = resp.changes == provider_pb2.DiffResponse.DIFF_SOME
        return Diff(changes=changes, replaces=list(resp.replaces),
                    delete_before_replace=True if resp.deleteBeforeReplace else None)

    def create(self, call: Call, inputs: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        resp = self._invoke("create", call, "Create", provider_pb2.CreateRequest(
            urn=call.urn, name=call.name, type=call.type, timeout=call.timeout,
            properties=props.json_to_struct(props.strip_secrets(inputs)),
        ))
        if not resp.id:
            raise ProviderError("create returned an empty id; a dynamic provider's create must return an id")
        return resp.id, props.annotate_secrets(props.struct_to_json(resp.properties), inputs)

    def update(self, call, old_inputs, old_outputs, news, ignore_changes) -> dict[str, Any]:
        resp = self._invoke("update", call, "Update", provider_pb2.UpdateRequest(
            id=call.id, urn=call.urn, name=call.name, type=call.type, timeout=call.timeout,
            olds=props.json_to_struct(props.strip_secrets(old_outputs)),
            news=props.json_to_struct(props.strip_secrets(news)),
            old_inputs=props.json_to_struct(props.strip_secrets(old_inputs)),
            ignoreChanges=ignore_changes,
        ))
        return props.annotate_secrets(props.struct_to_json(resp.properties), news)

    def delete(self, call: Call, inputs: dict[str, Any], outputs: dict[str, Any]) -> None:
        self._invoke("delete", call, "Delete", provider_pb2.DeleteRequest(
            id=call.id, urn=call.urn, name=call.name, type=call.type, timeout=call.timeout,
            properties=props.json_to_struct(props.strip_secrets(outputs)),
            old_inputs=props.json_to_struct(props.strip_secrets(inputs)),
        ))

    def read(self, call: Call, state: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        resp = self._invoke("read", call, "Read", provider_pb2.ReadRequest(
            id=call.id, urn=call.urn, name=call.name, type=call.type,
            properties=props.json_to_struct(props.strip_secrets(state)),
            inputs=props.json_to_struct(props.strip_secrets(state)),
        ))
        return resp.id, props.annotate_secrets(props.struct_to_json(resp.properties), state)
