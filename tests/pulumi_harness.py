"""Runs a Pulumi program under the SDK's mock runtime and records what it registered, secret-aware.

Each recorded resource keeps its inputs twice: as values, and as a "plain view" in which every secret-wrapped value
is replaced by "[secret]", so tests can assert that a canary never reaches a non-secret input.
"""

from __future__ import annotations

import runpy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pulumi
from google.protobuf import json_format
from pulumi.runtime import mocks as pulumi_mocks

ROOT = Path(__file__).resolve().parents[1]
SECRET_SIG = "1b47061264138c4ac30d75fd1eb44270"
SIG_KEY = "4dabf18193072939515e22adb298388d"


@dataclass
class Registered:
    typ: str
    name: str
    inputs: dict[str, Any]
    plain_view: Any
    secret_keys: set[str]
    parent: str


@dataclass
class Recording:
    resources: list[Registered] = field(default_factory=list)
    exports: dict[str, Any] = field(default_factory=dict)
    export_secrets: set[str] = field(default_factory=set)

    def of_type(self, suffix: str) -> list[Registered]:
        return [r for r in self.resources if r.typ.endswith(suffix)]

    def named(self, name: str) -> Registered:
        return next(r for r in self.resources if r.name == name)


def _plain(value: Any) -> Any:
    """Replace every secret envelope with a marker; keep everything else as JSON."""
    if isinstance(value, dict):
        if value.get(SIG_KEY) == SECRET_SIG:
            return "[secret]"
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


class _RecordingMonitor(pulumi_mocks.MockMonitor):
    def __init__(self, mocks: pulumi.runtime.Mocks, recording: Recording) -> None:
        super().__init__(mocks)
        self.recording = recording
        self._raw: dict[tuple[str, str], tuple[Any, str]] = {}

    def RegisterResource(self, request):  # noqa: N802 - gRPC method name
        raw = json_format.MessageToDict(request.object)
        self._raw[(request.type, request.name)] = (raw, request.parent)
        return super().RegisterResource(request)


class _Mocks(pulumi.runtime.Mocks):
    def __init__(self, recording: Recording, outputs_for: Callable[[str, str, dict], dict], monitor_ref: list) -> None:
        self.recording = recording
        self.outputs_for = outputs_for
        self.monitor_ref = monitor_ref

    def new_resource(self, args: pulumi.runtime.MockResourceArgs):
        raw, parent = self.monitor_ref[0]._raw.get((args.typ, args.name), ({}, ""))
        secret_keys = {k for k, v in raw.items() if isinstance(v, dict) and v.get(SIG_KEY) == SECRET_SIG}
        self.recording.resources.append(Registered(args.typ, args.name, dict(args.inputs), _plain(raw), secret_keys, parent))
        state = dict(args.inputs)
        state.update(self.outputs_for(args.typ, args.name, args.inputs))
        return f"{args.name}-id", state

    def call(self, args: pulumi.runtime.MockCallArgs):
        return {}


def run_program(
    config: dict[str, str],
    secret_keys: list[str],
    outputs_for: Callable[[str, str, dict], dict],
    program: Path = ROOT / "__main__.py",
    stack: str = "dev",
    project: str = "kimi-cluster",
    recording: Recording | None = None,
) -> Recording:
    """Run `program` to completion under mocks; raise whatever the program raised (`recording` keeps what got in)."""
    recording = recording if recording is not None else Recording()
    monitor_ref: list = []
    mocks = _Mocks(recording, outputs_for, monitor_ref)
    monitor = _RecordingMonitor(mocks, recording)
    monitor_ref.append(monitor)
    pulumi.runtime.set_mocks(mocks, project=project, stack=stack, preview=False, monitor=monitor)
    pulumi.runtime.set_all_config(config, secret_keys)

    root = pulumi.runtime.get_root_resource()
    root.outputs.clear()  # the mock runtime keeps one root stack per process

    @pulumi.runtime.test
    def _run():
        runpy.run_path(str(program), run_name="__main__")
        exports = dict(root.outputs)

        async def collect():
            for key, value in exports.items():
                out = pulumi.Output.from_input(value)
                recording.exports[key] = await out.future()
                if await out.is_secret():
                    recording.export_secrets.add(key)

        return pulumi.Output.from_input(collect())

    _run()
    return recording
