"""No component receives a Settings object, closures included: every resource the program makes (components and
custom resources alike, InferenceCluster itself included: it gets the blueprint) is checked as it is constructed, in its
arguments, its inputs, and whatever they hold: containers, dataclass fields, attributes of this project's objects,
functools.partial arguments, bound methods' objects and functions' closure cells and defaults."""

from __future__ import annotations

import dataclasses
import functools
import types
from collections.abc import Iterator
from typing import Any

import pulumi
import pytest

from kimi_cluster.settings import Settings
from tests.plan.graph_record import STACKS, run_stack


def _holds_settings(value: Any, path: str, seen: set[int]) -> Iterator[str]:
    if id(value) in seen or isinstance(value, str | bytes | int | float | bool | type(None)):
        return
    seen.add(id(value))
    if isinstance(value, Settings):
        yield path
        return
    if isinstance(value, pulumi.Output):
        return  # a value the cluster worked out; what it closes over is the cluster's own
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _holds_settings(v, f"{path}[{k!r}]", seen)
    elif isinstance(value, list | tuple | set | frozenset):
        for i, v in enumerate(value):
            yield from _holds_settings(v, f"{path}[{i}]", seen)
    elif isinstance(value, functools.partial):
        yield from _holds_settings([value.func, value.args, value.keywords], f"{path}.partial", seen)
    elif isinstance(value, types.MethodType):
        yield from _holds_settings(value.__self__, f"{path}.__self__", seen)
    elif isinstance(value, types.FunctionType):
        cells = [c.cell_contents for c in value.__closure__ or () if c.cell_contents is not None]
        yield from _holds_settings([cells, value.__defaults__, value.__kwdefaults__], f"{path}.<closure>", seen)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            yield from _holds_settings(getattr(value, f.name), f"{path}.{f.name}", seen)
    elif type(value).__module__.startswith("kimi_cluster") and hasattr(value, "__dict__"):
        yield from _holds_settings(vars(value), f"{path}.__dict__", seen)


def _resource_classes() -> list[type]:
    found: list[type] = []
    todo: list[type] = [pulumi.Resource]
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo.extend(cls.__subclasses__())
    return found


@pytest.mark.parametrize("stack", sorted(STACKS))
def test_no_component_gets_settings(stack: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from pulumi_command import remote

    from kimi_cluster.deploy.cluster import InferenceCluster

    # Both load their classes (Command; StepGroup and the cluster's own) before they are looked for.
    assert remote.Command and InferenceCluster

    checked: list[str] = []
    found: list[str] = []

    def guard(cls: type) -> None:
        original = cls.__dict__["__init__"]

        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            name = next((a for a in args if isinstance(a, str) and a.startswith("kimi")), repr(args[:2]))
            checked.append(f"{cls.__name__} {name}")
            found.extend(_holds_settings([args, kwargs], f"{cls.__name__}({name})", set()))
            original(self, *args, **kwargs)

        monkeypatch.setattr(cls, "__init__", __init__)

    for cls in _resource_classes():
        if "__init__" in cls.__dict__:
            guard(cls)
    run_stack(stack)
    kinds = sorted({c.split()[0] for c in checked})
    assert "Command" in kinds, kinds
    assert "StepGroup" in kinds, kinds
    assert "InferenceCluster" in kinds, kinds
    assert not found, found
