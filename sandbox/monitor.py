"""The resource monitor and engine log the Pulumi Python SDK talks to inside the sandbox engine.

A MockMonitor subclass, so `pulumi.runtime` runs the program unchanged, whose answers come from actually
performing each resource (through `steps.Deployment`) instead of from canned mocks.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from google.protobuf import empty_pb2
from pulumi.runtime.mocks import MockMonitor, Mocks
from pulumi.runtime.proto import engine_pb2, resource_pb2

from . import props
from .console import Console
from .state import STACK_TYPE, read_outputs
from .steps import Deployment, Registration

STACK_REFERENCE = "pulumi:pulumi:StackReference"

_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)")
_UNIT_SECONDS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(text: str) -> float | None:
    """A Go duration string from customTimeouts ("30m", "1h30m", "90s") in seconds; None when empty."""
    text = text.strip()
    if not text:
        return None
    parts = _DURATION_PART.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"custom timeout {text!r} is not a duration like '30m' or '1h30m'")
    return sum(float(n) * _UNIT_SECONDS[u] for n, u in parts)


def make_urn(stack: str, project: str, parent_urn: str, type_: str, name: str) -> str:
    """The engine's URN: the parent's type chain is kept, except the root stack's (top-level resources show none)."""
    qualified = type_
    if parent_urn:
        parent_type = parent_urn.split("::")[2]
        if parent_type != STACK_TYPE:
            qualified = f"{parent_type}${type_}"
    return f"urn:pulumi:{stack}::{project}::{qualified}::{name}"


class _NoMocks(Mocks):
    """MockMonitor wants a Mocks; every answer here comes from the Deployment, so these are never consulted."""

    def call(self, args):
        raise NotImplementedError("the sandbox monitor answers invokes itself")

    def new_resource(self, args):
        raise NotImplementedError("the sandbox monitor answers registrations itself")


class SandboxMonitor(MockMonitor):
    def __init__(
        self,
        deployment: Deployment,
        project: str,
        stack: str,
        console: Console,
        stack_references: Mapping[str, Path] | None = None,
    ) -> None:
        super().__init__(_NoMocks())
        self._deployment = deployment
        self._project = project
        self._stack = stack
        self._console = console
        self._stack_references = dict(stack_references or {})

    def make_urn(self, parent: str, type_: str, name: str) -> str:
        return make_urn(self._stack, self._project, parent, type_, name)

    @staticmethod
    def _timeouts(request: Any) -> dict[str, float]:
        found: dict[str, float] = {}
        if request.HasField("customTimeouts"):
            for op in ("create", "update", "delete"):
                seconds = parse_duration(getattr(request.customTimeouts, op))
                if seconds:
                    found[op] = seconds
        return found

    def RegisterResource(self, request):
        urn = self.make_urn(request.parent, request.type, request.name)
        dependencies = set(request.dependencies)
        for deps in request.propertyDependencies.values():
            dependencies.update(deps.urns)
        reg = Registration(
            urn=urn,
            type=request.type,
            name=request.name,
            custom=bool(request.custom),
            parent=request.parent,
            provider=request.provider,
            inputs=props.struct_to_json(request.object),
            dependencies=sorted(dependencies),
            additional_secret_outputs=list(request.additionalSecretOutputs),
            replace_on_changes=list(request.replaceOnChanges),
            ignore_changes=list(request.ignoreChanges),
            delete_before_replace=request.deleteBeforeReplace if request.deleteBeforeReplaceDefined else None,
            replacement_trigger=(
                props.value_to_json(request.replacement_trigger) if request.HasField("replacement_trigger") else None
            ),
            protect=bool(request.protect),
            retain_on_delete=bool(request.retainOnDelete),
            timeouts=self._timeouts(request),
            remote=bool(request.remote),
            import_id=request.importId,
        )
        res = self._deployment.register(reg)
        # Components answer with their inputs, custom resources with their outputs, as the engine does.
        return resource_pb2.RegisterResourceResponse(
            urn=urn, id=res.id, object=props.json_to_struct(res.outputs if reg.custom else res.inputs),
        )

    def RegisterResourceOutputs(self, request):
        self._deployment.set_outputs(request.urn, props.struct_to_json(request.outputs))
        return empty_pb2.Empty()

    def ReadResource(self, request):
        urn = self.make_urn(request.parent, request.type, request.name)
        if request.type != STACK_REFERENCE:
            id_, outputs = self._deployment.read(
                urn, request.type, request.name, request.id, props.struct_to_json(request.properties)
            )
            return resource_pb2.ReadResourceResponse(urn=urn, id=id_, properties=props.json_to_struct(outputs))
        name = request.id
        where = self._stack_references.get(name)
        if where is None:
            known = ", ".join(sorted(self._stack_references)) or "none configured"
            raise RuntimeError(f"stack reference {name!r}: no sandbox workdir given for it (known: {known})")
        state_path = where / "state.json" if where.is_dir() else where
        if not state_path.is_file():
            raise RuntimeError(f"stack reference {name!r}: {state_path} does not exist (has that stack been up?)")
        outputs = read_outputs(state_path)
        self._console.learn(outputs)
        result = {
            "name": name,
            "outputs": outputs,
            "secretOutputNames": sorted(k for k, v in outputs.items() if props.contains_secret(v)),
        }
        return resource_pb2.ReadResourceResponse(urn=urn, properties=props.json_to_struct(result))

    def Invoke(self, request):
        args = props.struct_to_json(request.args)
        if request.tok == "pulumi:pulumi:getResource":
            res = self._deployment.lookup(str(args.get("urn", "")))
            if res is None:
                raise RuntimeError(f"getResource: unknown resource {args.get('urn')!r}")
            found = {"urn": res.urn, "id": res.id, "state": res.outputs}
            return resource_pb2.ResourceInvokeResponse(**{"return": props.json_to_struct(found)})
        raise RuntimeError(f"invoke {request.tok!r} is not supported by the sandbox engine")

    def Call(self, request):
        raise RuntimeError(f"resource method call {request.tok!r} is not supported by the sandbox engine")


class EngineLog:
    """The SDK's `engine` service: pulumi.log.* lands here. Errors make the update fail, as with the CLI."""

    _LEVELS = {engine_pb2.DEBUG: "debug", engine_pb2.INFO: "info",
               engine_pb2.WARNING: "warning", engine_pb2.ERROR: "error"}

    def __init__(self, console: Console, show_debug: bool = False) -> None:
        self._console = console
        self._show_debug = show_debug
        self._lock = threading.Lock()
        self.errors: list[str] = []

    def Log(self, request):
        level = self._LEVELS.get(request.severity, "info")
        if level == "debug" and not self._show_debug:
            return empty_pb2.Empty()
        where = f" ({request.urn.rsplit('::', 1)[-1]})" if request.urn else ""
        message = request.message.rstrip()
        if level == "error":
            with self._lock:
                self.errors.append(message)
        prefix = "" if level == "info" else f"{level}: "
        for i, line in enumerate(message.splitlines() or [""]):
            self._console.line(f"  {prefix}{line}{where}" if i == 0 else f"    {line}")
        return empty_pb2.Empty()

    def GetRootResource(self, request):
        return engine_pb2.GetRootResourceResponse(urn="")

    def SetRootResource(self, request):
        return engine_pb2.SetRootResourceResponse()
