"""Decides and performs each resource's step (same, create, update, replace, delete) and records it in state.

`up` drives it from the program's RegisterResource calls, `destroy` from the state file; every completed step
is saved before the next answer, so a killed run leaves a state that the next run resumes from.
"""

from __future__ import annotations

import re
import threading
import time
import traceback
from collections import Counter
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace
from typing import Any

from . import props
from .console import Console, indent_rest
from .providers import Call, Provider, ProviderError, Registry, changed_keys
from .state import ResourceState, StateFile

_SYMBOL = {"create": "+", "update": "~", "replace": "+-", "delete": "-", "same": "="}


class StepFailed(Exception):
    """A resource's step failed; raised back into the program so the SDK fails that resource's outputs."""


class StepSkipped(Exception):
    """Not attempted because an earlier step failed, as `pulumi up` stops starting steps after an error."""


@dataclass(frozen=True)
class Failure:
    urn: str
    type: str
    name: str
    op: str
    reason: str

    def describe(self) -> str:
        return f"{self.type} {self.name!r}: {self.op} failed: {self.reason}"


@dataclass
class Registration:
    """What the program asked for in one RegisterResource call, in wire-format JSON."""

    urn: str
    type: str
    name: str
    custom: bool
    parent: str = ""
    provider: str = ""
    inputs: dict[str, Any] = field(default_factory=dict)
    dependencies: list[str] = field(default_factory=list)
    additional_secret_outputs: list[str] = field(default_factory=list)
    replace_on_changes: list[str] = field(default_factory=list)
    ignore_changes: list[str] = field(default_factory=list)
    delete_before_replace: bool | None = None
    replacement_trigger: Any = None
    protect: bool = False
    retain_on_delete: bool = False
    timeouts: dict[str, float] = field(default_factory=dict)
    remote: bool = False
    import_id: str = ""


def _unexpected(exc: Exception) -> ProviderError:
    """An engine-side error (a bug, a full disk) reported like a provider's, with its traceback as detail."""
    return ProviderError(f"{type(exc).__name__}: {exc}", "".join(traceback.format_exception(exc)))


def _root(path: str) -> str:
    return re.split(r"[.\[]", path, maxsplit=1)[0]


class Deployment:
    def __init__(
        self,
        state: StateFile,
        registry: Registry,
        console: Console,
        default_timeout: float,
        parallel: int,
    ) -> None:
        self._state = state
        self._registry = registry
        self._console = console
        self._default_timeout = default_timeout
        self._parallel = parallel
        self.counts: Counter[str] = Counter()
        self.failures: list[Failure] = []
        self._failed = threading.Event()
        self._lock = threading.Lock()
        self._registered: list[str] = []
        self._done: dict[str, threading.Event] = {}
        self._inflight = 0
        self._idle = threading.Condition(self._lock)

    # -- bookkeeping -----------------------------------------------------------------------------------------

    @property
    def registered(self) -> list[str]:
        with self._lock:
            return list(self._registered)

    def _fail(self, urn: str, type_: str, name: str, op: str, error: ProviderError) -> Failure:
        failure = Failure(urn, type_, name, op, error.message)
        with self._lock:
            self.failures.append(failure)
        self._failed.set()
        self._console.line(indent_rest(f"  error: {failure.describe()}", "      "))
        if error.detail and error.detail.strip() != error.message.strip():
            for line in error.detail.rstrip().splitlines():
                self._console.line(f"      {line}")
        return failure

    def _count(self, op: str) -> None:
        with self._lock:
            self.counts[op] += 1

    def drain(self, timeout: float) -> bool:
        """Wait until no step is running (after a program error, other steps may still be finishing)."""
        deadline = time.monotonic() + timeout
        with self._idle:
            while self._inflight:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._idle.wait(timeout=left)
        return True

    def _timeout(self, timeouts: dict[str, float], op: str) -> float:
        return timeouts.get(op) or self._default_timeout

    # -- up ----------------------------------------------------------------------------------------------------

    def register(self, reg: Registration) -> ResourceState:
        with self._lock:
            duplicate = reg.urn in self._done
            if not duplicate:
                self._registered.append(reg.urn)
                done = self._done[reg.urn] = threading.Event()
                self._inflight += 1
        if duplicate:
            raise self._raise(reg, "register", ProviderError(
                f"duplicate resource URN {reg.urn}: another resource has the same type, name and parent type"))
        try:
            self._await_dependencies(reg)
            if self._failed.is_set():
                raise StepSkipped(f"{reg.type} {reg.name!r} was not attempted: an earlier resource failed")
            return self._step(reg)
        except (StepFailed, StepSkipped):
            raise
        except Exception as exc:
            raise self._raise(reg, "step", _unexpected(exc)) from exc
        finally:
            done.set()
            with self._idle:
                self._inflight -= 1
                self._idle.notify_all()

    def _await_dependencies(self, reg: Registration) -> None:
        # The SDK only registers a resource once its dependencies' URNs resolve, and a URN resolves when its
        # RegisterResource returns, i.e. after the step finished. This guard keeps that true even if it changes.
        for dep in reg.dependencies:
            with self._lock:
                event = self._done.get(dep)
            # The engine's own patience, not the resource's customTimeouts: the real engine enforces neither.
            if event is not None and not event.wait(timeout=self._default_timeout * 2):
                raise StepFailed(f"{reg.type} {reg.name!r}: gave up waiting for dependency {dep}")

    def read(self, urn: str, type_: str, name: str, id_: str, state: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """ReadResource of an existing resource (a dynamic resource with an `id` option): not managed, not stored."""
        try:
            provider = self._registry.for_type(type_)
            reader = getattr(provider, "read", None)
            if reader is None:
                raise ProviderError(f"reading existing {type_} resources is not supported by the sandbox engine")
            found_id, outputs = reader(Call(urn, type_, name, id_, self._default_timeout), state)
        except ProviderError as exc:
            raise StepFailed(self._fail(urn, type_, name, "read", exc).describe()) from None
        self._console.learn(outputs)
        return found_id, outputs

    def lookup(self, urn: str) -> ResourceState | None:
        return self._state.live(urn)

    def set_outputs(self, urn: str, outputs: dict[str, Any]) -> None:
        """RegisterResourceOutputs: a component's (or the stack's) outputs."""
        self._console.learn(outputs)
        with self._state.lock:
            res = self._state.live(urn)
            if res is None:
                raise RuntimeError(f"outputs registered for unknown resource {urn}")
            res.outputs = outputs
            self._state.save()

    def _new_state(self, reg: Registration, inputs: dict[str, Any], id_: str, outputs: dict[str, Any]) -> ResourceState:
        return ResourceState(
            urn=reg.urn, type=reg.type, name=reg.name, custom=reg.custom, id=id_, parent=reg.parent,
            provider=reg.provider, inputs=inputs, outputs=outputs, dependencies=list(reg.dependencies),
            additional_secret_outputs=list(reg.additional_secret_outputs),
            replace_on_changes=list(reg.replace_on_changes), delete_before_replace=reg.delete_before_replace,
            replacement_trigger=reg.replacement_trigger, protect=reg.protect, retain_on_delete=reg.retain_on_delete,
            timeouts=dict(reg.timeouts),
        )

    def _step(self, reg: Registration) -> ResourceState:
        self._console.learn(reg.inputs)
        old = self._state.live(reg.urn)
        if not reg.custom:
            if reg.remote:
                raise self._raise(reg, "create", ProviderError("remote (multi-language) components are not supported"))
            # Components and the stack only group resources: record them, nothing to perform.
            res = self._new_state(reg, reg.inputs, "", old.outputs if old else {})
            self._state.put(res)
            self._count("same" if old and old.inputs == reg.inputs else ("update" if old else "create"))
            return res
        if reg.import_id:
            raise self._raise(reg, "import", ProviderError("importing existing resources is not supported"))
        try:
            provider = self._registry.for_type(reg.type)
        except ProviderError as exc:
            raise self._raise(reg, "register", exc) from None
        try:
            news = dict(reg.inputs)
            if old is not None:
                for path in reg.ignore_changes:
                    key = _root(path)
                    if key in old.inputs:
                        news[key] = old.inputs[key]
                    else:
                        news.pop(key, None)
            call = Call(reg.urn, reg.type, reg.name, old.id if old else "", self._timeout(reg.timeouts, "create"))
            checked = provider.check(call, old.inputs if old else {}, news)
        except ProviderError as exc:
            raise self._raise(reg, "check", exc) from None
        self._console.learn(checked)
        if old is None:
            return self._create(reg, provider, checked)
        trigger_changed = reg.replacement_trigger is not None and reg.replacement_trigger != old.replacement_trigger
        # Unchanged inputs still go to the provider's diff, as the Pulumi engine does (step_generator.go: only
        # UseLegacyDiff skips it): a provider may see that the cloud lost the resource (a reclaimed VM).
        try:
            diff = provider.diff(replace(call, timeout=self._timeout(reg.timeouts, "update")),
                                 old.inputs, old.outputs, checked, [_root(p) for p in reg.ignore_changes])
        except ProviderError as exc:
            raise self._raise(reg, "diff", exc) from None
        keys = changed_keys(old.inputs, checked)
        has_changes = diff.changes if diff.changes is not None else bool(keys)
        replaces = list(diff.replaces)
        for pattern in reg.replace_on_changes:
            if (pattern == "*" and keys) or _root(pattern) in keys:
                replaces.append(_root(pattern))
        if trigger_changed:
            replaces.append("(replacement trigger)")
        if replaces:
            if old.protect:
                raise self._raise(reg, "replace", ProviderError("the resource is protected; it cannot be replaced"))
            if reg.delete_before_replace is not None:
                delete_first = reg.delete_before_replace
            else:
                delete_first = bool(diff.delete_before_replace)
            return self._replace(reg, provider, old, checked, sorted(set(replaces)), delete_first)
        if has_changes:
            return self._update(reg, provider, old, checked)
        return self._same(reg, old, checked)

    def _raise(self, reg: Registration, op: str, error: ProviderError) -> StepFailed:
        failure = self._fail(reg.urn, reg.type, reg.name, op, error)
        return StepFailed(failure.describe())

    def _announce(self, op: str, type_: str, name: str, suffix: str = "") -> None:
        self._console.line(f"  {_SYMBOL[op]} {type_} {name}{suffix}")

    def _same(self, reg: Registration, old: ResourceState, checked: dict[str, Any]) -> ResourceState:
        outputs = props.mark_secret_keys(old.outputs, reg.additional_secret_outputs)
        res = self._new_state(reg, checked, old.id, outputs)
        self._state.put(res)
        self._count("same")
        return res

    def _create(
        self, reg: Registration, provider: Provider, checked: dict[str, Any], op: str = "create",
        retire: ResourceState | None = None,
    ) -> ResourceState:
        timeout = self._timeout(reg.timeouts, "create")
        self._announce(op, reg.type, reg.name, " creating...")
        started = time.monotonic()
        self._state.begin(reg.urn, reg.type, "create")
        try:
            id_, outputs = provider.create(Call(reg.urn, reg.type, reg.name, "", timeout), checked)
        except ProviderError as exc:
            self._state.complete(reg.urn, "create")
            raise self._raise(reg, "create", exc) from None
        outputs = props.mark_secret_keys(outputs, reg.additional_secret_outputs)
        self._console.learn(outputs)
        res = self._new_state(reg, checked, id_, outputs)
        # A replacement is recorded and the old resource marked for deletion in one save: the file never shows
        # two live resources under one URN, or none.
        self._state.complete(reg.urn, "create", put=res, retire=retire)
        if op == "create":
            self._count("create")
            self._announce("create", reg.type, reg.name, f" created ({time.monotonic() - started:.1f}s)")
        return res

    def _update(
        self, reg: Registration, provider: Provider, old: ResourceState, checked: dict[str, Any]
    ) -> ResourceState:
        self._announce("update", reg.type, reg.name, " updating...")
        started = time.monotonic()
        self._state.begin(reg.urn, reg.type, "update")
        call = Call(reg.urn, reg.type, reg.name, old.id, self._timeout(reg.timeouts, "update"))
        try:
            outputs = provider.update(call, old.inputs, old.outputs, checked, [_root(p) for p in reg.ignore_changes])
        except ProviderError as exc:
            self._state.complete(reg.urn, "update")
            raise self._raise(reg, "update", exc) from None
        outputs = props.mark_secret_keys(outputs, reg.additional_secret_outputs)
        self._console.learn(outputs)
        res = self._new_state(reg, checked, old.id, outputs)
        self._state.complete(reg.urn, "update", put=res)
        self._count("update")
        self._announce("update", reg.type, reg.name, f" updated ({time.monotonic() - started:.1f}s)")
        return res

    def _replace(
        self, reg: Registration, provider: Provider, old: ResourceState, checked: dict[str, Any],
        because: list[str], delete_first: bool,
    ) -> ResourceState:
        self._announce("replace", reg.type, reg.name, f" replacing (changed: {', '.join(because)})...")
        started = time.monotonic()
        if delete_first:
            try:
                self._delete_one(old, counted=False)
            except ProviderError as exc:
                raise self._raise(reg, "delete (before replace)", exc) from None
            res = self._create(reg, provider, checked, op="replace")
        else:
            # Create the replacement first; the old one is deleted after the program finishes, as Pulumi does,
            # so dependents have moved over before it goes away.
            res = self._create(reg, provider, checked, op="replace", retire=old)
        self._count("replace")
        self._announce("replace", reg.type, reg.name, f" replaced ({time.monotonic() - started:.1f}s)")
        return res

    # -- deletion (end of up, destroy) -----------------------------------------------------------------------

    def finish_up(self) -> bool:
        """After a successful program: delete what it no longer declares and replaced resources, dependents first."""
        registered = set(self.registered)
        doomed = [r for r in self._state.snapshot() if r.delete or r.urn not in registered]
        ok = self.delete_all(doomed)
        if ok:
            self._state.reorder(self.registered)
        return ok

    def destroy(self) -> bool:
        return self.delete_all(self._state.snapshot())

    def delete_all(self, doomed: list[ResourceState]) -> bool:
        """Delete in reverse dependency order, independent ones in parallel; stop starting new ones on failure."""
        if not doomed:
            return True
        by_urn: dict[str, list[int]] = {}
        for i, res in enumerate(doomed):
            by_urn.setdefault(res.urn, []).append(i)
        # blockers[i]: doomed resources that need doomed[i], so must go first; needs[i]: the reverse.
        blockers: dict[int, set[int]] = {i: set() for i in range(len(doomed))}
        needs: dict[int, set[int]] = {i: set() for i in range(len(doomed))}
        for i, res in enumerate(doomed):
            for urn in res.depends_on():
                for j in by_urn.get(urn, []):
                    if j != i:
                        blockers[j].add(i)
                        needs[i].add(j)
        # Neither a command nor a provider call is cut off (the real engine enforces no customTimeouts): the
        # providers' and scripts' own deadlines end them. This engine-side patience only catches a stuck step.
        patience = max(self._default_timeout, *(self._timeout(r.timeouts, "delete") for r in doomed)) + 120
        ready = [i for i, b in blockers.items() if not b]
        running: dict[Future[None], int] = {}
        ok = True
        pool = ThreadPoolExecutor(max_workers=self._parallel, thread_name_prefix="delete")
        try:
            while ready or running:
                while ready and ok:
                    i = ready.pop()
                    running[pool.submit(self._delete_step, doomed[i])] = i
                if not running:
                    break
                finished, _ = wait(list(running), timeout=patience, return_when=FIRST_COMPLETED)
                if not finished:
                    names = ", ".join(doomed[i].name for i in running.values())
                    self._console.line(f"  error: deletes still running after {patience:.0f}s: {names}")
                    return False
                for fut in finished:
                    i = running.pop(fut)
                    if fut.exception() is not None:
                        ok = False
                        continue
                    for j in needs[i]:
                        blockers[j].discard(i)
                        if not blockers[j]:
                            ready.append(j)
                if not ok:
                    ready.clear()
            return ok
        finally:
            pool.shutdown(wait=False, cancel_futures=True)

    def _delete_step(self, res: ResourceState) -> None:
        try:
            self._delete_one(res)
        except ProviderError as exc:
            self._fail(res.urn, res.type, res.name, "delete", exc)
            raise
        except Exception as exc:
            self._fail(res.urn, res.type, res.name, "delete", _unexpected(exc))
            raise

    def _delete_one(self, res: ResourceState, counted: bool = True) -> None:
        """Delete one resource; `counted` is False when it is the old half of a replacement."""
        counted = counted and not res.delete
        if not res.custom:
            self._state.remove(res)
            if counted:
                self._count("delete")
            return
        if res.protect:
            raise ProviderError("the resource is protected; unprotect it before deleting")
        self._announce("delete", res.type, res.name, " deleting (replaced)..." if res.delete else " deleting...")
        started = time.monotonic()
        if res.retain_on_delete:
            self._state.remove(res)
            self._console.line(f"    {res.name}: retained (retainOnDelete); removed from state only")
            if counted:
                self._count("delete")
            return
        provider = self._registry.for_type(res.type)
        self._state.begin(res.urn, res.type, "delete")
        try:
            provider.delete(Call(res.urn, res.type, res.name, res.id, self._timeout(res.timeouts, "delete")),
                            res.inputs, res.outputs)
        except ProviderError:
            self._state.complete(res.urn, "delete")
            raise
        self._state.complete(res.urn, "delete", remove=res)
        if counted:
            self._count("delete")
        self._announce("delete", res.type, res.name, f" deleted ({time.monotonic() - started:.1f}s)")

