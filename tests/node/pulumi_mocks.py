"""Runs a small program under Pulumi's mocks and keeps, per resource, its raw inputs, parent and dependencies.

Raw inputs keep the secret envelopes the SDK sends, so a test can tell a secret input from a plain one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable

import pulumi
from google.protobuf import json_format
from pulumi.runtime import mocks as pulumi_mocks

SECRET_SIG_KEY = "4dabf18193072939515e22adb298388d"
SECRET_SIG = "1b47061264138c4ac30d75fd1eb44270"
FAKE_HOST_PRIVATE_KEY = "-----BEGIN OPENSSH PRIVATE KEY-----\nfake-host-key\n-----END OPENSSH PRIVATE KEY-----\n"
FAKE_HOST_PUBLIC_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIfakehostkey"


@dataclass
class Res:
    typ: str
    name: str
    raw: dict[str, Any]
    parent: str
    deps: list[str]
    secret_outputs: list[str]
    timeouts: dict[str, str]
    inputs: dict[str, Any] = field(default_factory=dict)

    def plain(self) -> Any:
        """The inputs with every secret replaced by a marker: what would be readable in state."""
        return _plain(self.raw)

    def values(self) -> dict[str, Any]:
        """The inputs with secret envelopes opened: what the provider would receive."""
        return _open(self.inputs)

    def secret_paths(self) -> list[str]:
        return [k for k, v in self.raw.items() if _is_secret(v)]


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


class _Monitor(pulumi_mocks.MockMonitor):
    def __init__(self, mocks: "_Mocks") -> None:
        super().__init__(mocks)
        self.by_name: dict[str, Res] = {}

    def RegisterResource(self, request):  # noqa: N802 - gRPC method name
        t = request.customTimeouts
        self.by_name[request.name] = Res(
            typ=request.type, name=request.name, raw=json_format.MessageToDict(request.object),
            parent=short(request.parent), deps=[short(d) for d in request.dependencies],
            secret_outputs=list(request.additionalSecretOutputs),
            timeouts={"create": t.create, "update": t.update} if t else {},
        )
        return super().RegisterResource(request)


class _Mocks(pulumi.runtime.Mocks):
    def __init__(self) -> None:
        self.monitor: _Monitor | None = None

    def new_resource(self, args: pulumi.runtime.MockResourceArgs):
        outs = dict(args.inputs)
        if args.typ == "command:remote:Command":
            outs.update(stdout="ok", stderr="")
        if args.typ.endswith("NodeHostKey"):
            outs.update(private_key=FAKE_HOST_PRIVATE_KEY, public_key=FAKE_HOST_PUBLIC_KEY)
        if self.monitor and args.name in self.monitor.by_name:
            self.monitor.by_name[args.name].inputs = dict(args.inputs)
        return f"{args.name}-id", outs

    def call(self, args: pulumi.runtime.MockCallArgs):
        return {}


def run(program: Callable[[], Any]) -> tuple[dict[str, Res], Any]:
    """Run `program` under mocks; returns the registered resources by name and the program's resolved result."""
    mocks = _Mocks()
    monitor = _Monitor(mocks)
    mocks.monitor = monitor
    pulumi.runtime.set_mocks(mocks, project="kimi-cluster", stack="dev", preview=False, monitor=monitor)
    box: dict[str, Any] = {}

    @pulumi.runtime.test
    def _run():
        result = program()
        return pulumi.Output.from_input(result).apply(lambda v: box.setdefault("result", v))

    _run()
    return monitor.by_name, box.get("result")


def dumps(value: Any) -> str:
    return json.dumps(value, default=str)
