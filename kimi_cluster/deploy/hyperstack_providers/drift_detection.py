"""What changed behind Pulumi's back, as a diff sees it: the VM or rule a stack recorded, asked of the API.

Pulumi's engine calls a provider's diff even when the inputs are unchanged (`pkg/resource/deploy/step_generator.go`),
so `pulumi up` alone finds drift, with or without a `pulumi refresh` first: a VM that is gone, DELETING, in ERROR,
SHUTOFF (stopped: it still bills, and serves nothing) or of another flavor or image than the stack made it is
replaced (deleted first, then made again with its chain and rules: never adopted as it is); a rule that is gone
from its VM is made again. An API that does not answer says nothing: the diff then goes by the inputs alone.

The VM's own diff always asks the API; its rules' diffs, which the engine runs after it (they depend on the VM),
reuse that answer for a few seconds, from a cache in the provider host's process that every rule create or delete
here clears for its VM: a diff pass asks about each VM once, not once per rule. Helpers of
kimi_cluster/deploy/hyperstack_providers/providers.py, found through its imports (a pickled provider names its class
only). The emulator's side of drift, a change made behind a stack's back, is
kimi_cluster/fakes/hyperstack_emulator/drift_injection.py; what `kimi-cluster plan` reports of it,
kimi_cluster/operator/drift_report.py.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from kimi_cluster.deploy.hyperstack_providers.inputs import as_int
from kimi_cluster.deploy.hyperstack_providers.vm_lifecycle import GONE
from kimi_cluster.hyperstack_api.api import HyperstackClient, HyperstackError
from kimi_cluster.hyperstack_api.records import VmRecord

# One diff pass over a stack's resources takes well under this; a later pass (the update after its preview) may
# reuse it: nothing the diff looks at changes between the two unless someone else changes it.
CACHE_SECONDS = 5.0
STOPPED = ("STOPPING", "SHUTOFF")
_NOT_FOUND = "not found"
_seen: dict[int, tuple[float, VmRecord | str]] = {}
T = TypeVar("T")


def asked(question: Callable[[HyperstackClient], T | None], client: Callable[[], HyperstackClient]) -> T | None:
    """The question's answer, or None when no client can be made (no key: a preview goes by its inputs alone)."""
    try:
        with client() as api:
            return question(api)
    except HyperstackError:
        return None


def live_vm(api: HyperstackClient, vm_id: Any, fresh: bool = False) -> VmRecord | str | None:
    """The VM's record, "not found" on a 404, or None when its id is no number or the API does not answer; the one
    read in the last CACHE_SECONDS unless `fresh` (the VM's own diff always asks: its rules' diffs follow it)."""
    if not str(vm_id).isdigit():
        return None
    key = as_int(vm_id)
    now = time.monotonic()
    cached = _seen.get(key)
    if cached is not None and now - cached[0] < CACHE_SECONDS and not fresh:
        return cached[1]
    try:
        found: VmRecord | str = api.get_vm(key)
    except HyperstackError as err:
        if not err.not_found:
            return None
        found = _NOT_FOUND
    _seen[key] = (now, found)
    return found


def forget(vm_id: Any) -> None:
    """A change made here (a rule added or deleted, a VM deleted): the next diff asks the API again."""
    if str(vm_id).isdigit():
        _seen.pop(as_int(vm_id), None)


def vm_drift(api: HyperstackClient, id_: str, olds: Mapping[str, Any]) -> tuple[str, list[str]] | None:
    """(why the VM is made again, the input to name in the replacement) or None when it is as the stack recorded."""
    vm = live_vm(api, id_, fresh=True)
    if vm is None:
        return None
    if isinstance(vm, str):
        return "no longer exists (the API answers 404)", ["name"]
    status = str(vm.get("status") or "")
    if status in GONE:
        return f"is {status} although nothing here deleted it", ["name"]
    if status == "ERROR":
        return "is in ERROR", ["name"]
    if status in STOPPED:
        return (f"is {status}: stopped behind Pulumi's back, it still bills and serves nothing"), ["name"]
    for key, live in (("flavor_name", (vm.get("flavor") or {}).get("name")),
                      ("image_name", (vm.get("image") or {}).get("name"))):
        recorded = olds.get(key)
        if live and recorded and live != recorded:
            return (f"has {key.removesuffix('_name')} {live!r}, not the stack's {recorded!r}: drift, never "
                    "adopted"), [key]
    return None


def rule_gone(api: HyperstackClient, id_: str, olds: Mapping[str, Any], news: Mapping[str, Any]) -> bool:
    """Whether the rule the stack recorded is no longer on its VM (which is still there, with the same id)."""
    vm_id = olds.get("vm_id")
    if not str(id_).isdigit() or str(news.get("vm_id")) != str(vm_id):
        return False  # a new VM (or one a preview does not know yet): the rule is replaced anyway
    vm = live_vm(api, vm_id)
    if not isinstance(vm, dict) or str(vm.get("status") or "") in GONE:
        return False  # unanswered, or the VM itself is gone: its diff replaces it, and the rule with it
    return not any(str(r.get("id")) == str(id_) for r in vm.get("security_rules") or [])
