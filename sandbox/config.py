"""The project and stack configuration the sandbox engine hands a program: Pulumi.yaml, Pulumi.<stack>.yaml, overrides.

Produces the flat `namespace:key -> string` map and secret key list that `pulumi up` gives the language host.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from . import props


class ConfigError(Exception):
    """The project or stack configuration cannot be used; the message names the file and key."""


@dataclass(frozen=True)
class Project:
    name: str
    directory: Path
    program_dir: Path
    # Project-level defaults from Pulumi.yaml's `config:` block, already namespaced.
    defaults: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class StackConfig:
    values: Mapping[str, str]
    secret_keys: frozenset[str]

    def wire(self) -> dict[str, Any]:
        """Config as provider Configure args: namespaced keys, secret values wrapped as secrets."""
        return {k: props.make_secret(v) if k in self.secret_keys else v for k, v in self.values.items()}

    def env_json(self) -> str:
        return json.dumps(dict(self.values))


def _as_config_string(value: Any) -> str:
    # Pulumi config values reach the program as strings; structured values as JSON (what get_object parses).
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    return json.dumps(value)


def _qualify(project: str, key: str) -> str:
    return key if ":" in key else f"{project}:{key}"


def _contains_secure(value: Any) -> bool:
    if isinstance(value, dict):
        return (set(value) == {"secure"}) or any(_contains_secure(v) for v in value.values())
    if isinstance(value, list):
        return any(_contains_secure(v) for v in value)
    return False


def load_project(project_dir: str | Path) -> Project:
    directory = Path(project_dir).resolve()
    path = directory / "Pulumi.yaml"
    if not path.is_file():
        path = directory / "Pulumi.yml"
    if not path.is_file():
        raise ConfigError(f"{directory}: no Pulumi.yaml (is this a Pulumi project directory?)")
    try:
        doc = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
    name = doc.get("name")
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{path}: `name` is required")
    runtime = doc.get("runtime")
    runtime_name = runtime.get("name") if isinstance(runtime, dict) else runtime
    if runtime_name not in (None, "python"):
        raise ConfigError(f"{path}: runtime {runtime_name!r} is not supported; the sandbox engine runs Python programs")
    program_dir = (directory / doc["main"]).resolve() if doc.get("main") else directory
    if not (program_dir / "__main__.py").is_file():
        raise ConfigError(f"{program_dir}: no __main__.py to run")
    defaults: dict[str, str] = {}
    for key, spec in (doc.get("config") or {}).items():
        qualified = _qualify(name, key)
        if isinstance(spec, dict):
            if "value" in spec:
                defaults[qualified] = _as_config_string(spec["value"])
            elif "default" in spec:
                defaults[qualified] = _as_config_string(spec["default"])
        elif spec is not None:
            defaults[qualified] = _as_config_string(spec)
    return Project(name=name, directory=directory, program_dir=program_dir, defaults=defaults)


def load_stack_config(
    project: Project,
    stack: str,
    overrides: Mapping[str, Any] | None = None,
    secret_overrides: Mapping[str, Any] | None = None,
) -> StackConfig:
    """Project defaults < Pulumi.<stack>.yaml < overrides. `secure:` values need an override: no key to decrypt here."""
    values: dict[str, str] = dict(project.defaults)
    secret_keys: set[str] = set()
    undecryptable: list[str] = []
    path = project.directory / f"Pulumi.{stack}.yaml"
    if path.is_file():
        try:
            doc = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
        for key, value in (doc.get("config") or {}).items():
            qualified = _qualify(project.name, key)
            if _contains_secure(value):
                undecryptable.append(qualified)
                secret_keys.add(qualified)
                values.pop(qualified, None)
                continue
            values[qualified] = _as_config_string(value)
    for key, value in (overrides or {}).items():
        qualified = _qualify(project.name, key)
        values[qualified] = _as_config_string(value)
    for key, value in (secret_overrides or {}).items():
        qualified = _qualify(project.name, key)
        values[qualified] = _as_config_string(value)
        secret_keys.add(qualified)
    missing = [k for k in undecryptable if k not in values]
    if missing:
        raise ConfigError(
            f"{path}: secure value(s) for {', '.join(sorted(missing))} cannot be decrypted by the sandbox engine; "
            "pass them as secret overrides (e.g. --secret KEY=VALUE)"
        )
    return StackConfig(values=values, secret_keys=frozenset(secret_keys))
