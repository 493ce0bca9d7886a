"""Provider inputs as Pulumi hands them over: unknown values in a preview, numbers that may arrive as text, the
checks every resource's names share, and the diff of inputs into replaces and in-place updates."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from typing import Any

from pulumi.dynamic import CheckFailure, DiffResult, ResourceProvider

from kimi_cluster.deploy.hyperstack_providers.failures import ProvisioningError
from kimi_cluster.deploy.unknowns import is_unknown

NAME_MAX = 50  # CreateEnvironment / ImportKeypairPayload / CreateInstancesPayload: name max_length


def as_int(value: Any) -> int:
    return int(float(value)) if isinstance(value, (int, float)) else int(str(value))


def known(value: Any) -> bool:
    return value is not None and not is_unknown(value)


def name_failures(props: Mapping[str, Any], *keys: str) -> list[CheckFailure]:
    failures = []
    for key in keys:
        value = props.get(key)
        if value is None:
            failures.append(CheckFailure(key, f"{key} is required"))
        elif is_unknown(value):
            continue
        elif not isinstance(value, str) or not value.strip():
            failures.append(CheckFailure(key, f"{key} must be a non-empty string"))
        elif key == "name" and len(value) > NAME_MAX:
            failures.append(CheckFailure(key, f"{key} is {len(value)} characters; Hyperstack allows {NAME_MAX}"))
    return failures


def require_valid(provider: ResourceProvider, props: dict[str, Any]) -> None:
    failures = provider.check({}, props).failures
    if failures:
        raise ProvisioningError("; ".join(f"{f.property}: {f.reason}" for f in failures))


def diff_inputs(olds: Mapping[str, Any], news: Mapping[str, Any], replace: tuple[str, ...],
                update: tuple[str, ...], delete_before_replace: bool) -> DiffResult:
    replaces = [k for k in replace if olds.get(k) != news.get(k)]
    updates = [k for k in update if olds.get(k) != news.get(k)]
    return DiffResult(changes=bool(replaces or updates), replaces=replaces,
                      delete_before_replace=delete_before_replace if replaces else None)


def timing_inputs(spec: Any, props: Mapping[str, Any]) -> dict[str, float]:
    """The `*_seconds` inputs of `spec` (a dataclass) from `props`; a missing or empty one takes the spec's default
    (a dataclass keeps each field's default as a class attribute)."""
    return {f.name: float(props.get(f.name) or getattr(spec, f.name)) for f in fields(spec)
            if f.name.endswith("_seconds")}
