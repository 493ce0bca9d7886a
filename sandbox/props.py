"""Pulumi wire-format property values held as plain JSON: Struct conversion, secret marking, display.

Values stay exactly as the engine protocol carries them (secrets are signature-keyed maps), so the state file,
the monitor and the providers all speak the same language as a real `pulumi up`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from google.protobuf import json_format, struct_pb2

# Signatures from the Pulumi property protocol (sdk/go/common/resource/properties.go; pulumi/runtime/rpc.py).
SIG_KEY = "4dabf18193072939515e22adb298388d"
SECRET_SIG = "1b47061264138c4ac30d75fd1eb44270"
RESOURCE_SIG = "5cf8f73096256a8f31e491e813e4eb8e"
UNKNOWN = "04da6b54-80e4-46f7-96ec-b56ff0331ba9"

SECRET_MARK = "[secret]"


def _normalize(value: Any) -> Any:
    # Struct numbers are doubles; integral ones go back to int so state and display read like the program wrote.
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    if isinstance(value, dict):
        return {k: _normalize(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_normalize(v) for v in value]
    return value


def struct_to_json(struct: struct_pb2.Struct | None) -> dict[str, Any]:
    if struct is None:
        return {}
    return _normalize(json_format.MessageToDict(struct))


def value_to_json(value: struct_pb2.Value) -> Any:
    return _normalize(json_format.MessageToDict(value))


def json_to_struct(props: Mapping[str, Any] | None) -> struct_pb2.Struct:
    struct = struct_pb2.Struct()
    if props:
        struct.update(dict(props))
    return struct


def is_secret(value: Any) -> bool:
    return isinstance(value, dict) and value.get(SIG_KEY) == SECRET_SIG


def make_secret(value: Any) -> Any:
    return value if is_secret(value) else {SIG_KEY: SECRET_SIG, "value": value}


def contains_secret(value: Any) -> bool:
    if is_secret(value):
        return True
    if isinstance(value, dict):
        return any(contains_secret(v) for v in value.values())
    if isinstance(value, list):
        return any(contains_secret(v) for v in value)
    return False


def strip_secrets(value: Any) -> Any:
    """The plain value, with every secret marker removed (what a provider that does not accept secrets sees)."""
    if is_secret(value):
        return strip_secrets(value.get("value"))
    if isinstance(value, dict):
        return {k: strip_secrets(v) for k, v in value.items()}
    if isinstance(value, list):
        return [strip_secrets(v) for v in value]
    return value


def annotate_secrets(outputs: Mapping[str, Any], inputs: Mapping[str, Any]) -> dict[str, Any]:
    """Re-mark outputs whose same-named input held a secret, as the engine does for providers without secrets."""
    marked = dict(outputs)
    for key, in_value in inputs.items():
        if key in marked and contains_secret(in_value) and not contains_secret(marked[key]):
            marked[key] = make_secret(marked[key])
    return marked


def mark_secret_keys(outputs: Mapping[str, Any], keys: Iterable[str]) -> dict[str, Any]:
    """Apply `additional_secret_outputs`: these top-level outputs are secret whatever the provider said."""
    marked = dict(outputs)
    for key in keys:
        if key in marked and not is_secret(marked[key]):
            marked[key] = make_secret(marked[key])
    return marked


def secret_strings(value: Any, inside: bool = False) -> Iterator[str]:
    """Every plaintext string held inside a secret, so the console can mask it wherever it shows up."""
    if is_secret(value):
        yield from secret_strings(value.get("value"), True)
    elif isinstance(value, dict):
        for v in value.values():
            yield from secret_strings(v, inside)
    elif isinstance(value, list):
        for v in value:
            yield from secret_strings(v, inside)
    elif inside and isinstance(value, str):
        yield value
    elif inside and isinstance(value, (int, float)) and not isinstance(value, bool):
        yield str(value)


def has_unknowns(value: Any) -> bool:
    if value == UNKNOWN:
        return True
    if isinstance(value, dict):
        return any(has_unknowns(v) for v in value.values())
    if isinstance(value, list):
        return any(has_unknowns(v) for v in value)
    return False


def render(value: Any) -> str:
    """Compact JSON-like text for the screen, secret leaves shown as [secret]."""
    if is_secret(value):
        return SECRET_MARK
    if isinstance(value, dict):
        if value.get(SIG_KEY) == RESOURCE_SIG:
            return f"<resource {value.get('urn', '?')}>"
        return "{" + ", ".join(f"{json.dumps(k)}: {render(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(render(v) for v in value) + "]"
    return json.dumps(value)
