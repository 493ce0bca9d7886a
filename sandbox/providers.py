"""Resource providers as the sandbox engine sees them: one protocol, a registry by type token, the small built-ins.

Dynamic resources and pulumi-command live in their own modules; provider resources are handled here.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from . import props

DYNAMIC_PREFIX = "pulumi-python:dynamic"
LOCAL_COMMAND = "command:local:Command"
REMOTE_COMMAND = "command:remote:Command"
PROVIDER_PREFIX = "pulumi:providers:"


class ProviderError(Exception):
    """A provider operation failed; `message` is the short reason, `detail` the full story (e.g. a traceback)."""

    def __init__(self, message: str, detail: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.detail = detail


class UnsupportedResource(ProviderError):
    """The sandbox engine has no way to perform this resource type."""


@dataclass(frozen=True)
class Call:
    """Who a provider call is for, and how long it may take."""

    urn: str
    type: str
    name: str
    id: str = ""
    timeout: float = 3600.0


@dataclass
class Diff:
    # None: the provider cannot tell; the engine then compares inputs itself.
    changes: bool | None
    replaces: list[str] = field(default_factory=list)
    delete_before_replace: bool | None = None


class Provider(Protocol):
    """All values are wire-format JSON (secrets marked); each provider applies its own secrets semantics."""

    def check(self, call: Call, olds: dict[str, Any], news: dict[str, Any]) -> dict[str, Any]: ...

    def diff(
        self, call: Call, old_inputs: dict[str, Any], old_outputs: dict[str, Any], news: dict[str, Any],
        ignore_changes: list[str],
    ) -> Diff: ...

    def create(self, call: Call, inputs: dict[str, Any]) -> tuple[str, dict[str, Any]]: ...

    def update(
        self, call: Call, old_inputs: dict[str, Any], old_outputs: dict[str, Any], news: dict[str, Any],
        ignore_changes: list[str],
    ) -> dict[str, Any]: ...

    def delete(self, call: Call, inputs: dict[str, Any], outputs: dict[str, Any]) -> None: ...


def changed_keys(olds: dict[str, Any], news: dict[str, Any]) -> list[str]:
    """Top-level input keys whose values differ (secretness aside), the engine's own diff when a provider has none."""
    return sorted(
        k for k in set(olds) | set(news) if props.strip_secrets(olds.get(k)) != props.strip_secrets(news.get(k))
    )


class ProviderResources:
    """`pulumi:providers:*` resources (explicit or default provider instances): recorded, nothing to perform.

    The providers the sandbox emulates take no configuration that changes how they act, so an instance is
    just an id that other resources refer to.
    """

    def check(self, call: Call, olds: dict[str, Any], news: dict[str, Any]) -> dict[str, Any]:
        return dict(news)

    def diff(self, call, old_inputs, old_outputs, news, ignore_changes) -> Diff:
        return Diff(changes=bool(changed_keys(old_inputs, news)))

    def create(self, call: Call, inputs: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        return str(uuid.uuid4()), dict(inputs)

    def update(self, call, old_inputs, old_outputs, news, ignore_changes) -> dict[str, Any]:
        return dict(news)

    def delete(self, call: Call, inputs: dict[str, Any], outputs: dict[str, Any]) -> None:
        return None


class Registry:
    """Finds the provider for a type token; the dynamic host and command runners are built on first use."""

    def __init__(
        self,
        dynamic: Callable[[], Provider],
        local_commands: Callable[[], Provider],
        remote_commands: Callable[[], Provider],
    ) -> None:
        self._factories = {"dynamic": dynamic, "local": local_commands, "remote": remote_commands}
        self._built: dict[str, Provider] = {"providers": ProviderResources()}

    def _get(self, kind: str) -> Provider:
        if kind not in self._built:
            self._built[kind] = self._factories[kind]()
        return self._built[kind]

    def for_type(self, type_: str) -> Provider:
        if type_.startswith(DYNAMIC_PREFIX):
            return self._get("dynamic")
        if type_ == LOCAL_COMMAND:
            return self._get("local")
        if type_ == REMOTE_COMMAND:
            return self._get("remote")
        if type_.startswith(PROVIDER_PREFIX):
            return self._get("providers")
        raise UnsupportedResource(
            f"resource type {type_!r} is not supported by the sandbox engine; it performs Python dynamic "
            f"resources ({DYNAMIC_PREFIX}:*), {LOCAL_COMMAND}, {REMOTE_COMMAND} and {PROVIDER_PREFIX}* only"
        )

    def built(self) -> list[Provider]:
        return list(self._built.values())
