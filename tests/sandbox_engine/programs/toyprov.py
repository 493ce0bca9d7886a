"""Toy dynamic providers for the sandbox engine tests: files, a flaky file, a secret, a config probe, an in-process one.

Each call appends a JSON line to <dir>/calls.log (op, name, phase, pid, time) so tests can count and order them.
"""

from __future__ import annotations

import json
import os
import secrets
import time
from typing import Any

import pulumi
import pulumi.dynamic as dyn

# Set by a program to prove a provider runs out of process: the provider's module is imported afresh there.
PROGRAM_TOKEN: str | None = None


def _log(directory: str, op: str, name: str, phase: str) -> None:
    entry = {"op": op, "name": name, "phase": phase, "pid": os.getpid(), "t": time.time()}
    with open(os.path.join(directory, "calls.log"), "a") as handle:
        handle.write(json.dumps(entry) + "\n")


def _inputs(props: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in props.items() if k != "__provider"}


class FileProvider(dyn.ResourceProvider):
    """A file <dir>/files/<name>: content updates in place, a new name replaces."""

    def create(self, props: dict[str, Any]) -> dyn.CreateResult:
        _log(props["dir"], "create", props["name"], "start")
        time.sleep(float(props.get("delay") or 0))
        path = os.path.join(props["dir"], "files", props["name"])
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as handle:
            handle.write(props["content"])
        _log(props["dir"], "create", props["name"], "end")
        return dyn.CreateResult(id_=props["name"], outs={**_inputs(props), "path": path})

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> dyn.DiffResult:
        replaces = ["name"] if olds.get("name") != news.get("name") else []
        changed = bool(replaces) or olds.get("content") != news.get("content")
        return dyn.DiffResult(changes=changed, replaces=replaces)

    def update(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> dyn.UpdateResult:
        _log(news["dir"], "update", news["name"], "start")
        with open(olds["path"], "w") as handle:
            handle.write(news["content"])
        return dyn.UpdateResult(outs={**_inputs(news), "path": olds["path"]})

    def delete(self, _id: str, props: dict[str, Any]) -> None:
        _log(props["dir"], "delete", props["name"], "start")
        os.remove(props["path"])


class FlakyFileProvider(FileProvider):
    """Fails to create while <dir>/fail-<name> exists."""

    def create(self, props: dict[str, Any]) -> dyn.CreateResult:
        if os.path.exists(os.path.join(props["dir"], f"fail-{props['name']}")):
            _log(props["dir"], "create", props["name"], "failed")
            raise RuntimeError(f"flag file fail-{props['name']} exists")
        return super().create(props)


class SecretProvider(dyn.ResourceProvider):
    """Generates a token at create time; the resource marks it an additional secret output."""

    def create(self, props: dict[str, Any]) -> dyn.CreateResult:
        _log(props["dir"], "create", props["label"], "start")
        return dyn.CreateResult(id_=props["label"], outs={**_inputs(props), "token": "tok-" + secrets.token_hex(8)})

    def delete(self, _id: str, props: dict[str, Any]) -> None:
        _log(props["dir"], "delete", props["label"], "start")


class ConfigProbeProvider(dyn.ResourceProvider):
    """Reports the stack config it was configured with, proving `configure` gets the stack's config."""

    greeting: str | None = None

    def configure(self, req: dyn.ConfigureRequest) -> None:
        self.greeting = req.config.get("greeting")

    def create(self, props: dict[str, Any]) -> dyn.CreateResult:
        from pulumi.runtime.config import get_config

        _log(props["dir"], "create", "probe", "start")
        # What the SDK's config lookup finds in the provider's process: nothing, as under the real engine (a
        # plugin gets no program config in its environment; stack config comes through configure only).
        return dyn.CreateResult(id_="probe", outs={**_inputs(props), "greeting": self.greeting,
                                                    "project": os.environ.get("PULUMI_PROJECT"),
                                                    "sdk_greeting": get_config("toy:greeting") or "(unset)",
                                                    "env_config": "PULUMI_CONFIG" in os.environ})


class ProgramGlobalProvider(dyn.ResourceProvider):
    """Only works where the program set PROGRAM_TOKEN: i.e. in the program's own process, never on a real `up`."""

    def create(self, props: dict[str, Any]) -> dyn.CreateResult:
        if PROGRAM_TOKEN is None:
            raise RuntimeError("PROGRAM_TOKEN is not set in the provider's process")
        return dyn.CreateResult(id_="global", outs={"token_len": len(PROGRAM_TOKEN)})


class File(dyn.Resource, module="toy", name="File"):
    path: pulumi.Output[str]

    def __init__(self, name: str, directory: str, content: pulumi.Input[str], delay: float = 0,
                 file_name: str | None = None, opts: pulumi.ResourceOptions | None = None,
                 provider: dyn.ResourceProvider | None = None) -> None:
        super().__init__(provider or FileProvider(), name,
                         {"dir": directory, "name": file_name or name, "content": content, "delay": delay,
                          "path": None}, opts)


class FlakyFile(File, module="toy", name="FlakyFile"):
    def __init__(self, name: str, directory: str, content: str, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(name, directory, content, opts=opts, provider=FlakyFileProvider())


class Token(dyn.Resource, module="toy", name="Token"):
    token: pulumi.Output[str]

    def __init__(self, name: str, directory: str, opts: pulumi.ResourceOptions | None = None) -> None:
        opts = pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(additional_secret_outputs=["token"]))
        super().__init__(SecretProvider(), name, {"dir": directory, "label": name, "token": None}, opts)


class ConfigProbe(dyn.Resource, module="toy", name="ConfigProbe"):
    greeting: pulumi.Output[str]
    project: pulumi.Output[str]
    sdk_greeting: pulumi.Output[str]
    env_config: pulumi.Output[bool]

    def __init__(self, name: str, directory: str, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(ConfigProbeProvider(), name, {"dir": directory, "greeting": None, "project": None,
                                                       "sdk_greeting": None, "env_config": None}, opts)


class NeedsProgramGlobal(dyn.Resource, module="toy", name="NeedsProgramGlobal"):
    token_len: pulumi.Output[int]

    def __init__(self, name: str, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(ProgramGlobalProvider(), name, {"token_len": None}, opts)
