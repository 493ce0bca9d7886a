"""A deployed stack as `status` needs it: its nodes (VM id, name, rank, addresses, SSH connection) and its outputs.

Reads `pulumi stack export --show-secrets` (or a file holding it). Secret values arrive as Pulumi's signature-keyed
maps (`{"4dabf18193072939515e22adb298388d": "1b47061264138c4ac30d75fd1eb44270", ...}`, the property protocol in
pulumi/sdk/go/common/resource/properties.go): the export's `plaintext` (the value as JSON text) or the SDK's wire
form's `value`; both are read here and the values only ever go to the SSH connection and the endpoint's
Authorization header.
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
_RANK = re.compile(r"rank-(\d{1,6})")  # fullmatch; a rank of a million digits is no rank


class StackStateError(Exception):
    """The stack's state cannot be read; the message says how to get it."""


def unwrap(value: Any) -> Any:
    """Secret wrappers removed: the plain value (None where only ciphertext is there).

    `pulumi stack export --show-secrets` writes a secret as {SIG_KEY: SECRET_SIG, "plaintext": "<the value as
    JSON>"}, and the JSON may hold secrets of its own (a connection's privateKey); the engine's wire form, which the
    SDK uses, holds the value itself under "value"."""
    if isinstance(value, dict):
        if value.get(SIG_KEY) == SECRET_SIG:
            if isinstance(value.get("plaintext"), str):
                try:
                    return unwrap(json.loads(value["plaintext"]))
                except (ValueError, RecursionError):  # not JSON, or nested deeper than the parser goes
                    return None
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


# The stack outputs status reads (a sandbox's reclaim too), and the shape each must have: a type or a tuple of types,
# or a one-item list for a list of that shape. A state of another shape (a hand-edited export, a release that wrote
# another type) is refused naming the output; an output that is absent is an older release's, and left alone.
_IP = (str, type(None))  # a VM without a floating IP has none
OUTPUT_SHAPES: dict[str, Any] = {
    "endpoint_url": str, "api_key": str, "ca_certificate": str, "topology": str, "region": str,
    "hourly_cost_usd": (int, float), "hourly_cost_source": str, "served_model_name": str,
    "caretaker_vm": str, "idle_stop_minutes": (int, float), "budget_usd": (int, float),
    "kimi_cluster_version": str, "environment_name": str, "head_public_ip": _IP,
    "node_names": [str], "node_public_ips": [_IP], "node_private_ips": [_IP],
    # replicas >= 2
    "replicas": int, "front_public_ip": str, "front_private_ip": _IP, "replica_node_names": [[str]],
    "replica_head_private_ips": [_IP],
}


def _shape_name(shape: Any) -> str:
    if isinstance(shape, list):
        return f"list of {_shape_name(shape[0])}"
    types = shape if isinstance(shape, tuple) else (shape,)
    return " or ".join("null" if t is type(None) else t.__name__ for t in types)


def shape_problem(value: Any, shape: Any) -> str | None:
    """What is wrong with `value` for `shape` ("is a str, not a list of strs"; "item 2 is ..."), else None."""
    if isinstance(shape, list):
        if not isinstance(value, list):
            return f"is a {type(value).__name__}, not a {_shape_name(shape)}"
        for index, item in enumerate(value):
            if (problem := shape_problem(item, shape[0])) is not None:
                return f"item {index} {problem}"
        return None
    types = shape if isinstance(shape, tuple) else (shape,)
    if isinstance(value, bool) and bool not in types or not isinstance(value, types):
        return f"is a {type(value).__name__}, not a {_shape_name(shape)}"
    return None


def checked_outputs(outputs: dict[str, Any]) -> dict[str, Any]:
    """`outputs` when every output status reads has its shape; StackStateError naming the first that has not."""
    for key, shape in OUTPUT_SHAPES.items():
        value = outputs.get(key)
        if value is not None and (problem := shape_problem(value, shape)) is not None:
            raise StackStateError(f"the stack output {key} {problem} (`pulumi up` registers the outputs "
                                  "again)")
    return outputs


def _mapping(value: Any, what: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise StackStateError(f"{what} is a {type(value).__name__}, not an object: is this a `pulumi stack export` "
                              "(with --show-secrets)?")
    return value


def _resources(doc: Any) -> list[dict[str, Any]]:
    doc = _mapping(doc, "the state")
    if "deployment" in doc:  # `pulumi stack export`
        doc = _mapping(doc["deployment"], "the state's deployment")
    resources = doc.get("resources") or []
    if not isinstance(resources, list) or not all(isinstance(r, dict) for r in resources):
        raise StackStateError("the state's resources are not a list of objects: is this a `pulumi stack export` "
                              "(with --show-secrets)?")
    return [r for r in resources if not r.get("delete")]


def _port(value: Any, host: str) -> int:
    try:
        port = int(value or 22)
    except (TypeError, ValueError):
        port = 0
    if isinstance(value, bool) or not 1 <= port <= 65535:
        raise StackStateError(f"the state's SSH connection to {host!r} has port {value!r}, not a TCP port")
    return port


def _outputs(stack_res: Mapping[str, Any] | None) -> dict[str, Any]:
    return checked_outputs(_mapping(unwrap((stack_res or {}).get("outputs")), "the stack's outputs"))


def _name_of(resource: Mapping[str, Any]) -> str:
    return str(resource.get("name") or str(resource.get("urn", "")).rsplit("::", 1)[-1])


def parse_state(doc: Any, stack: str) -> StackState:
    """The nodes and outputs of a state document; StackStateError (naming what is wrong) for any other shape."""
    resources = _resources(doc)
    stack_res = next((r for r in resources if r.get("type") == "pulumi:pulumi:Stack"), None)
    outputs = _outputs(stack_res)
    connections: dict[str, Connection] = {}
    for res in resources:
        if res.get("type") != "command:remote:Command":
            continue
        inputs = _mapping(res.get("inputs"), f"the inputs of {_name_of(res)}")
        conn = _mapping(unwrap(inputs.get("connection")), f"the connection of {_name_of(res)}")
        host = conn.get("host")
        if isinstance(host, str) and host and host not in connections:
            key, host_key = conn.get("privateKey"), conn.get("hostKey")
            connections[host] = Connection(host=host, user=str(conn.get("user") or "root"),
                                           private_key=key if isinstance(key, str) else None,
                                           host_key=host_key if isinstance(host_key, str) else None,
                                           port=_port(conn.get("port"), host))
    nodes: list[NodeRecord] = []
    for res in resources:
        if not str(res.get("type", "")).endswith("hyperstack:VirtualMachine"):
            continue
        outs = _mapping(unwrap(res.get("outputs")), f"the outputs of {_name_of(res)}")
        labels = outs.get("labels") or []
        ranks = [int(m.group(1)) for label in labels if (m := _RANK.fullmatch(str(label)))] \
            if isinstance(labels, list) else []
        public_ip = outs.get("public_ip") if isinstance(outs.get("public_ip"), str) else None
        nodes.append(NodeRecord(
            rank=ranks[0] if ranks else len(nodes), name=str(outs.get("name") or _name_of(res)),
            vm_id=str(res.get("id") or outs.get("vm_id") or ""), public_ip=public_ip,
            private_ip=outs.get("private_ip") if isinstance(outs.get("private_ip"), str) else None,
            connection=connections.get(public_ip) if public_ip else None))
    return StackState(stack=stack, outputs=outputs, nodes=sorted(nodes, key=lambda n: n.rank))


# A stack export of this project is a few MB at most: some hundred resources, and each node step's stdout, which
# pulumi-command keeps, is a progress line every pollSeconds. 32 MiB is several times the largest (8 replicas with
# hours of weights progress) and parses in well under a second; a bigger file (or /dev/zero) is refused unread.
STATE_MAX_BYTES = 32 * 1024 * 1024


def read_capped(path: str | Path, limit: int = STATE_MAX_BYTES) -> bytes:
    """At most `limit` bytes of `path` ("-": stdin); ValueError when there are more, OSError when unreadable."""
    import sys

    if str(path) == "-":
        data = sys.stdin.buffer.read(limit + 1)
    else:
        with open(path, "rb") as fh:
            data = fh.read(limit + 1)
    if len(data) > limit:
        raise ValueError(f"is larger than {limit // (1024 * 1024)} MB, more than any stack export of this project "
                         "(or not a file: a device never ends)")
    return data


def load_state_file(path: str | Path, stack: str) -> StackState:
    try:
        doc = json.loads(read_capped(path))
    except (OSError, ValueError, RecursionError) as exc:  # RecursionError: JSON nested past Python's stack
        raise StackStateError(f"cannot read the stack state {path}: {str(exc)[:300]}") from None
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
    try:
        doc = json.loads(done.stdout)
    except ValueError:
        raise StackStateError(f"`pulumi stack export --stack {stack}` printed no JSON") from None
    return parse_state(doc, stack)
