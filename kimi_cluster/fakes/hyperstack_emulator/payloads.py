"""Payload validation mirroring the vendor SDK's request models: what its pydantic models would reject is refused
with the API's 400, and so is an unknown field (which would hide a client's typo)."""

from __future__ import annotations

import base64
import binascii
import hashlib
import ipaddress
import re
from dataclasses import dataclass
from typing import Any, Literal

from .catalog import PROTOCOLS
from .state import ApiError


@dataclass(frozen=True)
class Field:
    kind: Literal["str", "int", "bool", "strlist", "object", "objlist", "number"]
    required: bool = False
    max_length: int | None = None


RULE = {"direction": Field("str", True), "ethertype": Field("str", True), "protocol": Field("str", True),
         "remote_ip_prefix": Field("str", True), "port_range_min": Field("int"), "port_range_max": Field("int")}

SCHEMAS: dict[str, dict[str, Field]] = {
    "CreateEnvironment": {"name": Field("str", True, 50), "region": Field("str", True)},
    "ImportKeypairPayload": {"name": Field("str", True, 50), "environment_name": Field("str", True),
                             "public_key": Field("str", True)},
    "CreateInstancesPayload": {
        "name": Field("str", True, 50), "environment_name": Field("str", True), "flavor_name": Field("str", True),
        "key_name": Field("str", True), "count": Field("int", True), "image_name": Field("str"),
        "assign_floating_ip": Field("bool"), "enable_port_randomization": Field("bool"),
        "create_bootable_volume": Field("bool"), "volume_name": Field("str"), "user_data": Field("str"),
        "callback_url": Field("str", False, 250), "labels": Field("strlist"), "security_rules": Field("objlist"),
        "enhanced_monitoring_enabled": Field("bool"), "flavor": Field("object"), "profile": Field("object"),
    },
    "CreateSecurityRulePayload": RULE,
    "EditLabelOfAnExistingVMPayload": {"labels": Field("strlist")},
}


def _type_ok(kind: str, value: Any) -> bool:
    if kind == "str":
        return isinstance(value, str)
    if kind == "int":  # strict, like pydantic StrictInt: a bool is not an int
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "strlist":
        return isinstance(value, list) and all(isinstance(v, str) for v in value)
    if kind == "object":
        return isinstance(value, dict)
    if kind == "objlist":
        return isinstance(value, list) and all(isinstance(v, dict) for v in value)
    return False


def validate(schema_name: str, body: Any) -> dict[str, Any]:
    """Reject what the SDK's pydantic model would reject, and unknown fields (which hide client typos)."""
    schema = SCHEMAS[schema_name]
    if not isinstance(body, dict):
        raise ApiError(400, "bad_request", f"{schema_name}: the body must be a JSON object")
    unknown = sorted(set(body) - set(schema))
    if unknown:
        raise ApiError(400, "bad_request", f"{schema_name}: unknown field(s) {', '.join(unknown)}")
    for name, spec in schema.items():
        value = body.get(name)
        if value is None:
            if spec.required:
                raise ApiError(400, "bad_request", f"{schema_name}.{name}: field required")
            continue
        if not _type_ok(spec.kind, value):
            raise ApiError(400, "bad_request", f"{schema_name}.{name}: expected {spec.kind}")
        if spec.max_length is not None and len(value) > spec.max_length:
            raise ApiError(400, "bad_request",
                           f"{schema_name}.{name}: at most {spec.max_length} characters, got {len(value)}")
    return body


def validate_rule(body: Any) -> dict[str, Any]:
    body = validate("CreateSecurityRulePayload", body)
    if body["direction"] not in ("ingress", "egress"):
        raise ApiError(400, "bad_request", "direction must be 'ingress' or 'egress'")
    if body["ethertype"] not in ("IPv4", "IPv6"):
        raise ApiError(400, "bad_request", "ethertype must be 'IPv4' or 'IPv6'")
    if body["protocol"] not in PROTOCOLS:
        raise ApiError(400, "bad_request", f"protocol must be one of {', '.join(PROTOCOLS)}")
    try:
        network = ipaddress.ip_network(body["remote_ip_prefix"], strict=False)
    except ValueError:
        raise ApiError(400, "bad_request", f"remote_ip_prefix {body['remote_ip_prefix']!r} is not a CIDR") from None
    if (network.version == 4) != (body["ethertype"] == "IPv4"):
        raise ApiError(400, "bad_request", "remote_ip_prefix does not match the ethertype")
    low, high = body.get("port_range_min"), body.get("port_range_max")
    for port in (low, high):
        if port is not None and not 1 <= port <= 65535:
            raise ApiError(400, "bad_request", "ports must be between 1 and 65535")
    if low is not None and high is not None and low > high:
        raise ApiError(400, "bad_request", "port_range_min is greater than port_range_max")
    return body


_KEY_RE = re.compile(r"^(ssh-(rsa|ed25519|dss)|ecdsa-sha2-nistp(256|384|521)|sk-\S+)\s+([A-Za-z0-9+/=]+)(\s.*)?$")


def fingerprint(public_key: str) -> str:
    match = _KEY_RE.match(public_key.strip())
    if not match:
        raise ApiError(400, "bad_request", "public_key is not an OpenSSH public key")
    try:
        blob = base64.b64decode(match.group(4), validate=True)
    except binascii.Error:
        raise ApiError(400, "bad_request", "public_key is not valid base64") from None
    digest = hashlib.md5(blob).hexdigest()
    return ":".join(digest[i:i + 2] for i in range(0, len(digest), 2))
