"""The sandbox engine's state file: every resource with its inputs and outputs, rewritten atomically after each step.

It plays the part of a Pulumi local backend's checkpoint: an interrupted `up` resumes from it and `destroy` reads it.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from . import props

STATE_VERSION = 1
STACK_TYPE = "pulumi:pulumi:Stack"


class StateError(Exception):
    """The state file cannot be read or belongs to another project or stack."""


@dataclass
class ResourceState:
    urn: str
    type: str
    name: str
    custom: bool
    id: str = ""
    parent: str = ""
    provider: str = ""
    inputs: dict[str, Any] = field(default_factory=dict)
    outputs: dict[str, Any] = field(default_factory=dict)
    dependencies: list[str] = field(default_factory=list)
    additional_secret_outputs: list[str] = field(default_factory=list)
    replace_on_changes: list[str] = field(default_factory=list)
    delete_before_replace: bool | None = None
    replacement_trigger: Any = None
    protect: bool = False
    retain_on_delete: bool = False
    # Custom timeouts in seconds by operation (create/update/delete), from the resource options.
    timeouts: dict[str, float] = field(default_factory=dict)
    # A replaced resource awaiting deletion (create-before-delete), kept next to its replacement under the same URN.
    delete: bool = False

    def __setattr__(self, name: str, value: Any) -> None:
        # Setting any field drops the line that save() reuses (every field is replaced whole, never edited in place).
        object.__setattr__(self, name, value)
        if name != "_line":
            object.__setattr__(self, "_line", None)

    def to_json(self) -> dict[str, Any]:
        # Shallow (the values are already JSON: props off the wire), not dataclasses.asdict's deep copy.
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def line(self) -> str:
        """The resource as the state file's one line of JSON, encoded once until a field is set again.

        save() runs twice a step and writes every resource each time: re-encoding an h100 stack's 1.8 MB of scripts
        and outputs took about 20 ms a save, most of the engine's CPU in an up.
        """
        cached: str | None = getattr(self, "_line", None)
        if cached is None:
            cached = json.dumps(self.to_json())
            object.__setattr__(self, "_line", cached)
        return cached

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ResourceState:
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in known})

    def depends_on(self) -> set[str]:
        """URNs this resource needs to exist while it exists: explicit and property dependencies, parent, provider."""
        needed = set(self.dependencies)
        if self.parent:
            needed.add(self.parent)
        if self.provider:
            # A provider reference is "<urn>::<id>"; the URN itself contains "::", so cut at the last separator.
            needed.add(self.provider.rsplit("::", 1)[0])
        needed.discard(self.urn)
        return needed


class StateFile:
    """Thread-safe in-memory state, persisted with write-to-temp-then-rename after every change."""

    def __init__(self, path: Path, project: str, stack: str) -> None:
        self.path = path
        self.project = project
        self.stack = stack
        self.resources: list[ResourceState] = []
        self.pending_operations: list[dict[str, Any]] = []
        self.lock = threading.RLock()

    @classmethod
    def open(cls, path: Path, project: str, stack: str) -> StateFile:
        state = cls(path, project, stack)
        if not path.exists():
            return state
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise StateError(f"{path}: cannot read state file: {exc}") from exc
        if doc.get("version") != STATE_VERSION:
            raise StateError(f"{path}: state version {doc.get('version')!r}, expected {STATE_VERSION}")
        if (doc.get("project"), doc.get("stack")) != (project, stack):
            raise StateError(
                f"{path}: state belongs to project {doc.get('project')!r} stack {doc.get('stack')!r}, "
                f"not {project!r} stack {stack!r}; use another workdir"
            )
        state.resources = [ResourceState.from_json(r) for r in doc.get("resources", [])]
        state.pending_operations = list(doc.get("pending_operations", []))
        return state

    # -- queries -----------------------------------------------------------------------------------------------

    def live(self, urn: str) -> ResourceState | None:
        with self.lock:
            for res in self.resources:
                if res.urn == urn and not res.delete:
                    return res
        return None

    def snapshot(self) -> list[ResourceState]:
        with self.lock:
            return list(self.resources)

    @property
    def outputs(self) -> dict[str, Any]:
        with self.lock:
            for res in self.resources:
                if res.type == STACK_TYPE and not res.delete:
                    return dict(res.outputs)
        return {}

    # -- changes (each persists) --------------------------------------------------------------------------------

    def put(self, res: ResourceState) -> None:
        """Record `res` as the live resource for its URN, after everything already recorded (completion order)."""
        with self.lock:
            self.resources = [r for r in self.resources if not (r.urn == res.urn and not r.delete)]
            self.resources.append(res)
            self.save()

    def remove(self, res: ResourceState) -> None:
        with self.lock:
            self.resources = [r for r in self.resources if r is not res]
            self.save()

    def begin(self, urn: str, type_: str, op: str) -> None:
        with self.lock:
            self.pending_operations.append({"urn": urn, "type": type_, "op": op, "started": time.time()})
            self.save()

    def complete(
        self,
        urn: str,
        op: str,
        *,
        put: ResourceState | None = None,
        remove: ResourceState | None = None,
        retire: ResourceState | None = None,
    ) -> None:
        """Close a pending operation and record its result in one save, so the file never shows half of a step:
        `put` the resulting resource, `remove` a deleted one, `retire` (mark for deletion) the one `put` replaces."""
        with self.lock:
            for i, pending in enumerate(self.pending_operations):
                if pending["urn"] == urn and pending["op"] == op:
                    del self.pending_operations[i]
                    break
            if retire is not None:
                retire.delete = True
            if remove is not None:
                self.resources = [r for r in self.resources if r is not remove]
            if put is not None:
                self.resources = [r for r in self.resources if not (r.urn == put.urn and not r.delete)]
                self.resources.append(put)
            self.save()

    def take_pending_operations(self) -> list[dict[str, Any]]:
        """Operations a killed run left unfinished; forgotten once reported, as the retry starts afresh."""
        with self.lock:
            pending, self.pending_operations = self.pending_operations, []
            if pending:
                self.save()
            return pending

    def reorder(self, order: Iterable[str]) -> None:
        """Put live resources in the given URN order (this run's completion order), leftovers first."""
        rank = {urn: i for i, urn in enumerate(order)}
        with self.lock:
            self.resources.sort(key=lambda r: (not r.delete, rank.get(r.urn, -1)))
            self.save()

    def save(self) -> None:
        with self.lock:
            head = {"version": STATE_VERSION, "project": self.project, "stack": self.stack, "updated": time.time()}
            # Secrets are stored in plaintext but stay wrapped in the secret signature, like a local backend with a
            # passphrase-less provider would hold them; the file is created owner-only.
            text = _document(head, [r.line() for r in self.resources], self.pending_operations)
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".state-", suffix=".tmp", dir=self.path.parent)
            try:
                with os.fdopen(fd, "w") as handle:
                    handle.write(text)
                    handle.flush()
                    os.fsync(handle.fileno())
                os.replace(tmp, self.path)
            except BaseException:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass
                raise


def read_outputs(path: Path) -> dict[str, Any]:
    """Stack outputs recorded in a state file, in wire format (secrets still marked)."""
    doc = json.loads(path.read_text())
    for res in doc.get("resources", []):
        if res.get("type") == STACK_TYPE and not res.get("delete"):
            return dict(res.get("outputs") or {})
    return {}


def plain_outputs(outputs: dict[str, Any]) -> tuple[dict[str, Any], frozenset[str]]:
    """Outputs with secret markers removed, and the names of those that held a secret."""
    return (
        {k: props.strip_secrets(v) for k, v in outputs.items()},
        frozenset(k for k, v in outputs.items() if props.contains_secret(v)),
    )


def _document(head: dict[str, Any], resources: list[str], pending: list[dict[str, Any]]) -> str:
    """The state file's JSON: its top keys a line each, then each resource (already encoded) on one line of its own.

    Not json.dumps(indent=...): with an indent the json module uses its pure-Python encoder, about twice as slow.
    """
    body = ",\n".join(f"  {resource}" for resource in resources)
    lines = ["{", *(f" {json.dumps(key)}: {json.dumps(value)}," for key, value in head.items()),
             f' "resources": [\n{body}\n ],' if resources else ' "resources": [],',
             f' "pending_operations": {json.dumps(pending)}', "}"]
    return "\n".join(lines) + "\n"
