"""The step logic (same, create, update, replace, delete ordering) against a fake provider, without a program."""

from __future__ import annotations

import io
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from sandbox import props
from sandbox.console import Console
from sandbox.providers import Call, Diff, ProviderError, Registry, changed_keys
from sandbox.state import StateFile
from sandbox.steps import Deployment, Registration, StepFailed

pytestmark = pytest.mark.timeout(30)


class FakeProvider:
    """Records calls; `replace_on` keys force replacement; names in `fail_delete` fail to delete."""

    def __init__(self, replace_on: tuple[str, ...] = (), delete_before_replace: bool | None = None) -> None:
        self.calls: list[tuple[str, str]] = []
        self.replace_on = replace_on
        self.delete_before_replace = delete_before_replace
        self.fail_delete: set[str] = set()
        self.delete_delay = 0.0
        self.deleting = 0  # deletes under way now, and the most at once
        self.most_deleting = 0
        self.lock = threading.Lock()

    def _record(self, op: str, call: Call) -> None:
        with self.lock:
            self.calls.append((op, call.name))

    def check(self, call, olds, news):
        return dict(news)

    def diff(self, call, old_inputs, old_outputs, news, ignore_changes):
        keys = changed_keys(old_inputs, news)
        return Diff(changes=bool(keys), replaces=[k for k in keys if k in self.replace_on],
                    delete_before_replace=self.delete_before_replace)

    def create(self, call, inputs):
        self._record("create", call)
        return f"{call.name}-id-{len(self.calls)}", {**inputs, "out": "secret-out"}

    def update(self, call, old_inputs, old_outputs, news, ignore_changes):
        self._record("update", call)
        return {**news, "out": old_outputs["out"]}

    def delete(self, call, inputs, outputs):
        self._record("delete", call)
        with self.lock:
            self.deleting += 1
            self.most_deleting = max(self.most_deleting, self.deleting)
        time.sleep(self.delete_delay)
        with self.lock:
            self.deleting -= 1
        if call.name in self.fail_delete:
            raise ProviderError(f"cannot delete {call.name}")


def deployment(tmp_path: Path, fake: FakeProvider) -> tuple[Deployment, StateFile, io.StringIO]:
    out = io.StringIO()
    state = StateFile.open(tmp_path / "state.json", "demo", "dev")
    registry = Registry(dynamic=lambda: fake, local_commands=lambda: fake, remote_commands=lambda: fake)
    return Deployment(state, registry, Console(out), default_timeout=30, parallel=8), state, out


def reg(name: str, deps: tuple[str, ...] = (), **fields: Any) -> Registration:
    values: dict[str, Any] = {"type": "pulumi-python:dynamic:Resource", "custom": True, "inputs": {"v": 1}}
    values.update(fields)
    return Registration(urn=f"urn:{name}", name=name, dependencies=[f"urn:{d}" for d in deps], **values)


def test_create_same_update_and_additional_secret_outputs(tmp_path: Path) -> None:
    fake = FakeProvider()
    first, state, _ = deployment(tmp_path, fake)
    created = first.register(reg("a", additional_secret_outputs=["out"]))
    assert props.is_secret(created.outputs["out"])
    second, state, _ = deployment(tmp_path, fake)
    same = second.register(reg("a", additional_secret_outputs=["out"]))
    assert same.id == created.id and second.counts == {"same": 1}
    third, state, _ = deployment(tmp_path, fake)
    updated = third.register(reg("a", inputs={"v": 2}))
    assert third.counts == {"update": 1} and updated.id == created.id
    assert fake.calls == [("create", "a"), ("update", "a")]


def test_replace_creates_first_and_deletes_the_old_one_after_the_program(tmp_path: Path) -> None:
    fake = FakeProvider(replace_on=("v",))
    deployment(tmp_path, fake)[0].register(reg("a"))
    run, state, _ = deployment(tmp_path, fake)
    new = run.register(reg("a", inputs={"v": 2}))
    assert [(r.id, r.delete) for r in state.snapshot()] == [("a-id-1", True), (new.id, False)]
    assert run.finish_up()
    assert [r.id for r in state.snapshot()] == [new.id]
    assert fake.calls == [("create", "a"), ("create", "a"), ("delete", "a")]
    assert run.counts == {"replace": 1}


def test_delete_before_replace_deletes_first(tmp_path: Path) -> None:
    fake = FakeProvider(replace_on=("v",), delete_before_replace=True)
    deployment(tmp_path, fake)[0].register(reg("a"))
    run, state, _ = deployment(tmp_path, fake)
    run.register(reg("a", inputs={"v": 2}))
    assert fake.calls == [("create", "a"), ("delete", "a"), ("create", "a")]
    assert len(state.snapshot()) == 1


def test_replace_on_changes_and_ignore_changes_from_the_program(tmp_path: Path) -> None:
    fake = FakeProvider()
    deployment(tmp_path, fake)[0].register(reg("a", inputs={"v": 1, "t": ["x"], "noise": 1}))
    run, _, _ = deployment(tmp_path, fake)
    run.register(reg("a", inputs={"v": 1, "t": ["y"], "noise": 2},
                     replace_on_changes=["t[*]"], ignore_changes=["noise"]))
    assert run.counts == {"replace": 1}
    run2, state, _ = deployment(tmp_path, fake)
    run2.register(reg("a", inputs={"v": 1, "t": ["y"], "noise": 3}, ignore_changes=["noise"]))
    assert run2.counts == {"same": 1}


def test_deletes_go_dependents_first_and_independent_ones_in_parallel(tmp_path: Path) -> None:
    fake = FakeProvider()
    run, state, _ = deployment(tmp_path, fake)
    run.register(reg("base"))
    run.register(reg("left", deps=("base",)))
    run.register(reg("right", deps=("base",)))
    run.register(reg("top", deps=("left", "right")))
    fake.calls.clear()
    fake.delete_delay = 0.3  # long enough for both of the middle wave to be under way at once
    assert run.destroy()
    order = [name for op, name in fake.calls]
    assert order[0] == "top" and order[-1] == "base" and set(order[1:3]) == {"left", "right"}
    # left and right went together (three waves, not four); top and base each alone.
    assert fake.most_deleting == 2
    assert state.snapshot() == []


def test_a_failed_delete_stops_the_ones_waiting_for_it_and_stays_in_state(tmp_path: Path) -> None:
    fake = FakeProvider()
    run, state, out = deployment(tmp_path, fake)
    run.register(reg("base"))
    run.register(reg("child", deps=("base",)))
    fake.fail_delete = {"child"}
    assert not run.destroy()
    assert [r.name for r in state.snapshot()] == ["base", "child"]
    assert "child': delete failed: cannot delete child" in out.getvalue()


def test_unsupported_types_fail_with_the_type_named(tmp_path: Path) -> None:
    run, _, out = deployment(tmp_path, FakeProvider())
    with pytest.raises(StepFailed, match="'aws:s3/bucket:Bucket' is not supported"):
        run.register(reg("bucket", type="aws:s3/bucket:Bucket"))
    assert run.failures[0].name == "bucket"


def test_after_a_failure_no_new_step_starts(tmp_path: Path) -> None:
    run, _, _ = deployment(tmp_path, FakeProvider())
    with pytest.raises(StepFailed):
        run.register(reg("bucket", type="aws:s3/bucket:Bucket"))
    with pytest.raises(Exception, match="not attempted"):
        run.register(reg("later"))
