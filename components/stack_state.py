"""A deployed stack as `status` needs it: its nodes (VM id, name, rank, addresses, SSH connection) and its outputs.

Reads a Pulumi checkpoint: `pulumi stack export --show-secrets` (a real backend) or the sandbox engine's state
file, which has the same resources with their inputs and outputs. Secret values arrive as Pulumi's signature-keyed
maps (`{"4dabf18193072939515e22adb298388d": "1b47061264138c4ac30d75fd1eb44270", "value": ...}`, the property protocol
in pulumi/sdk/go/common/resource/properties.go) or, with --show-secrets, as plain values; both are read here and the
values only ever go to the SSH connection and the endpoint's Authorization header.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SIG_KEY = "4dabf18193072939515e22adb298388d"
SECRET_SIG = "1b47061264138c4ac30d75fd1eb44270"
_RANK = re.compile(r"^rank-(\d+)$")


class StackStateError(Exception):
    """The stack's state cannot be read; the message says how to get it."""


def unwrap(value: Any) -> Any:
    """Secret wrappers removed: the plain value (None where only ciphertext is there)."""
    if isinstance(value, dict):
        if value.get(SIG_KEY) == SECRET_SIG:
            return unwrap(value.get("value")) if "value" in value else None
        return {k: unwrap(v) for k, v in value.items()}
    if isinstance(value, list):
        return [unwrap(v) for v in value]
    return value


@dataclass(frozen=True)
class Connection:
    host: str
    user: str
    private_key: str | None = field(default=None, repr=False)
    host_key: str | None = None
    port: int = 22


@dataclass(frozen=True)
class NodeRecord:
    rank: int
    name: str
    vm_id: str
    public_ip: str | None
    private_ip: str | None
    connection: Connection | None


@dataclass(frozen=True)
class StackState:
    stack: str
    outputs: dict[str, Any]
    nodes: list[NodeRecord]
    node_inputs: dict[str, Any] = field(default_factory=dict)  # what the node steps were rendered with

    @property
    def endpoint_url(self) -> str | None:
        return self.outputs.get("endpoint_url")


def _resources(doc: Mapping[str, Any]) -> list[dict[str, Any]]:
    if "deployment" in doc:  # `pulumi stack export`
        doc = doc["deployment"] or {}
    return [r for r in doc.get("resources") or [] if not r.get("delete")]


def _name_of(resource: Mapping[str, Any]) -> str:
    return str(resource.get("name") or str(resource.get("urn", "")).rsplit("::", 1)[-1])


def parse_state(doc: Mapping[str, Any], stack: str) -> StackState:
    resources = _resources(doc)
    stack_res = next((r for r in resources if r.get("type") == "pulumi:pulumi:Stack"), None)
    outputs = unwrap((stack_res or {}).get("outputs") or {})
    connections: dict[str, Connection] = {}
    for res in resources:
        if res.get("type") != "command:remote:Command":
            continue
        conn = unwrap((res.get("inputs") or {}).get("connection") or {})
        host = conn.get("host")
        if host and host not in connections:
            connections[host] = Connection(host=str(host), user=str(conn.get("user") or "root"),
                                           private_key=conn.get("privateKey"), host_key=conn.get("hostKey"),
                                           port=int(conn.get("port") or 22))
    nodes: list[NodeRecord] = []
    for res in resources:
        if not str(res.get("type", "")).endswith("hyperstack:VirtualMachine"):
            continue
        outs = unwrap(res.get("outputs") or {})
        ranks = [int(m.group(1)) for label in outs.get("labels") or [] if (m := _RANK.match(str(label)))]
        public_ip = outs.get("public_ip")
        nodes.append(NodeRecord(
            rank=ranks[0] if ranks else len(nodes), name=str(outs.get("name") or _name_of(res)),
            vm_id=str(res.get("id") or outs.get("vm_id") or ""), public_ip=public_ip,
            private_ip=outs.get("private_ip"), connection=connections.get(str(public_ip)) if public_ip else None))
    return StackState(stack=stack, outputs=outputs, nodes=sorted(nodes, key=lambda n: n.rank))


def load_state_file(path: str | Path, stack: str) -> StackState:
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise StackStateError(f"cannot read the stack state {path}: {exc}") from None
    return parse_state(doc, stack)


def export_stack(stack: str, cwd: str | Path | None = None) -> StackState:
    """`pulumi stack export --show-secrets` of a stack of this project (needs the Pulumi CLI and its backend)."""
    try:
        done = subprocess.run(["pulumi", "stack", "export", "--stack", stack, "--show-secrets"], cwd=cwd,
                              capture_output=True, text=True, timeout=120)
    except FileNotFoundError:
        raise StackStateError("the Pulumi CLI is not on PATH: install it, or pass the state with --state FILE "
                              "(pulumi stack export --show-secrets > FILE)") from None
    except subprocess.TimeoutExpired:
        raise StackStateError(f"`pulumi stack export --stack {stack}` did not answer within 120 s") from None
    if done.returncode != 0:
        raise StackStateError(f"`pulumi stack export --stack {stack}` failed: {done.stderr.strip()[:300]}")
    return parse_state(json.loads(done.stdout), stack)
