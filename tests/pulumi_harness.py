"""Runs Pulumi code under the SDK's mock runtime and records every registration, secret-aware.

Each record keeps the raw inputs with the secret envelopes the SDK sends, so a test can tell a secret input from a
plain one (`plain()` shows what state would hold readable), plus dependencies, parent and custom timeouts.
"""

from __future__ import annotations

import base64
import json
import re
import runpy
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pulumi
from google.protobuf import json_format
from pulumi.runtime import mocks as pulumi_mocks
from pulumi.runtime import settings as pulumi_settings
from pulumi.runtime.stack import Stack

ROOT = Path(__file__).resolve().parents[1]
SECRET_SIG_KEY = "4dabf18193072939515e22adb298388d"
SECRET_SIG = "1b47061264138c4ac30d75fd1eb44270"
FAKE_HOST_PRIVATE_KEY = "-----BEGIN OPENSSH PRIVATE KEY-----\nfake-host-key\n-----END OPENSSH PRIVATE KEY-----\n"
FAKE_HOST_PUBLIC_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIfakehostkey"

OutputsFor = Callable[[str, str, dict], dict]


def _is_secret(v: Any) -> bool:
    return isinstance(v, dict) and v.get(SECRET_SIG_KEY) == SECRET_SIG


def _plain(v: Any) -> Any:
    if _is_secret(v):
        return "[secret]"
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_plain(x) for x in v]
    return v


def _open(v: Any) -> Any:
    if _is_secret(v):
        return _open(v.get("value"))
    if isinstance(v, dict):
        return {k: _open(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_open(x) for x in v]
    return v


def short(urn: str) -> str:
    return urn.rsplit("::", 1)[-1]


def dumps(value: Any) -> str:
    return json.dumps(value, default=str)


@dataclass
class Res:
    """One registered resource."""

    typ: str
    name: str
    raw: dict[str, Any]
    parent: str
    deps: list[str]
    secret_outputs: list[str]
    timeouts: dict[str, str]
    inputs: dict[str, Any] = field(default_factory=dict)
    urn: str = ""  # the full URN the engine would give it (parent types, type, name)
    parent_urn: str = ""
    dep_urns: list[str] = field(default_factory=list)
    deleted_with: str = ""  # the name of the resource whose delete takes this one along (the deletedWith option)

    def plain(self) -> Any:
        """The inputs with every secret replaced by a marker: what would be readable in state."""
        return _plain(self.raw)

    def values(self) -> dict[str, Any]:
        """The inputs with secret envelopes opened: what the provider would receive."""
        return _open(self.inputs)

    def secret_paths(self) -> list[str]:
        return [k for k, v in self.raw.items() if _is_secret(v)]

    def script(self) -> str:
        """The node script a remote command carries base64-encoded (see kimi_cluster.deploy.vm.remote_command_text)."""
        blob = re.search(r"printf %s '([^']+)'", self.values()["create"])
        assert blob, f"{self.name} carries no script"
        return base64.b64decode(blob.group(1)).decode()


@dataclass
class Recording:
    """Everything one run registered, in order, and the stack's exports."""

    resources: list[Res] = field(default_factory=list)
    exports: dict[str, Any] = field(default_factory=dict)
    export_secrets: set[str] = field(default_factory=set)

    def of_type(self, suffix: str) -> list[Res]:
        return [r for r in self.resources if r.typ.endswith(suffix)]

    @property
    def by_name(self) -> dict[str, Res]:
        return {r.name: r for r in self.resources}


def default_outputs(typ: str, name: str, inputs: dict) -> dict:
    """What providers answer when a test does not care: commands succeed, host keys exist."""
    if typ == "command:remote:Command":
        return {"stdout": "ok", "stderr": ""}
    if typ.endswith("NodeHostKey"):
        return {"private_key": FAKE_HOST_PRIVATE_KEY, "public_key": FAKE_HOST_PUBLIC_KEY}
    return {}


class _Monitor(pulumi_mocks.MockMonitor):
    def __init__(self, mocks: _Mocks, recording: Recording) -> None:
        super().__init__(mocks)
        self.recording = recording
        self.pending: dict[str, Res] = {}

    def RegisterResource(self, request):
        t = request.customTimeouts
        self.pending[request.name] = Res(
            typ=request.type, name=request.name, raw=json_format.MessageToDict(request.object),
            parent=short(request.parent), deps=[short(d) for d in request.dependencies],
            secret_outputs=list(request.additionalSecretOutputs),
            timeouts={"create": t.create, "update": t.update} if t else {},
            parent_urn=request.parent, dep_urns=list(request.dependencies),
            deleted_with=short(request.deletedWith) if request.deletedWith else "",
        )
        response = super().RegisterResource(request)
        for res in self.recording.resources[::-1]:  # new_resource has just recorded it (the last of its name)
            if res.name == request.name and res.typ == request.type and not res.urn:
                res.urn = response.urn
                break
        return response


class _Mocks(pulumi.runtime.Mocks):
    def __init__(self, recording: Recording, outputs_for: OutputsFor) -> None:
        self.recording = recording
        self.outputs_for = outputs_for
        self.monitor: _Monitor | None = None

    def new_resource(self, args: pulumi.runtime.MockResourceArgs):
        res = self.monitor.pending.pop(args.name) if self.monitor and args.name in self.monitor.pending else None
        if res is not None:
            res.inputs = dict(args.inputs)
            self.recording.resources.append(res)
        state = dict(args.inputs)
        state.update(default_outputs(args.typ, args.name, args.inputs))
        state.update(self.outputs_for(args.typ, args.name, args.inputs))
        return f"{args.name}-id", state

    def call(self, args: pulumi.runtime.MockCallArgs):
        return {}


def _install(recording: Recording, outputs_for: OutputsFor, stack: str, project: str) -> None:
    mocks = _Mocks(recording, outputs_for)
    mocks.monitor = _Monitor(mocks, recording)
    # set_mocks makes a root stack only when the process has none: without this, every run would keep the first
    # one's, named after whatever project and stack an earlier test in this process gave (the parent URN of every
    # top-level resource would depend on the order the tests ran in).
    pulumi_settings.ROOT.set(None)
    pulumi.runtime.set_mocks(mocks, project=project, stack=stack, preview=False, monitor=mocks.monitor)


def run(program: Callable[[], Any], outputs_for: OutputsFor = lambda *_: {}) -> tuple[dict[str, Res], Any]:
    """Run a callable under mocks; returns the registered resources by name and the program's resolved result."""
    recording = Recording()
    _install(recording, outputs_for, "dev", "kimi-cluster")
    box: dict[str, Any] = {}

    @pulumi.runtime.test
    def _run():
        return pulumi.Output.from_input(program()).apply(lambda v: box.setdefault("result", v))

    _run()
    return recording.by_name, box.get("result")


def run_program(
    config: dict[str, str],
    secret_keys: list[str],
    outputs_for: OutputsFor,
    program: Path = ROOT / "__main__.py",
    stack: str = "dev",
    project: str = "kimi-cluster",
    recording: Recording | None = None,
) -> Recording:
    """Run a program file to completion under mocks; raise whatever it raised (`recording` keeps what got in)."""
    recording = recording if recording is not None else Recording()
    _install(recording, outputs_for, stack, project)
    pulumi.runtime.set_all_config(config, secret_keys)
    root = pulumi.runtime.get_root_resource()
    assert isinstance(root, Stack)

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
