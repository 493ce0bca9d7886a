"""What destroy looks for beyond the stack's checkpoint: VMs, a keypair and an environment that an interrupted `up`
created but never recorded, and anything still in the sandbox's own emulator afterwards."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kimi_cluster.hyperstack_api.api import HyperstackError
from kimi_cluster.settings import Settings

from .nodes import STACK


def delete_unrecorded_vms(api: Any, settings: Settings, recorded: set[str], say: Callable[[str], None]
                           ) -> list[str]:
    """Our VMs that an interrupted up created but never recorded (`recorded`: the ids the checkpoint holds)."""
    from kimi_cluster.deploy.hyperstack_providers.failures import ProvisioningError
    from kimi_cluster.deploy.hyperstack_providers.vm_lifecycle import delete_vm_and_wait

    ours = {settings.node_name(rank) for rank in range(settings.nodes)}
    problems = []
    try:
        vms = api.list_vms(environment=settings.env_name)
    except HyperstackError as exc:  # an unreachable API is reported, not raised
        return [f"cannot list the VMs of {settings.env_name}: {exc}"]
    for vm in vms:
        labels = set(vm.get("labels") or [])
        if str(vm["id"]) in recorded or vm.get("name") not in ours or f"stack-{STACK}" not in labels:
            continue
        what = f"VM {vm['name']!r} (id {vm['id']})"
        say(f"deleting {what}: an interrupted up created it but never recorded it")
        try:
            delete_vm_and_wait(api, vm["id"], what, 120.0, 0.5)
        except (HyperstackError, ProvisioningError) as exc:  # one VM that will not go must not keep the rest alive
            problems.append(f"{what} could not be deleted: {exc}")
    return problems

def delete_unrecorded_environment(api: Any, settings: Settings, say: Callable[[str], None]) -> list[str]:
    """After a clean destroy, our keypair and environment can only be ones an interrupted up never recorded."""
    problems = []
    try:
        for kp in api.list_keypairs():
            if kp.get("name") == f"{settings.env_name}-key" and \
                    (kp.get("environment") or {}).get("name") == settings.env_name:
                say(f"deleting keypair {kp['name']!r}: an interrupted up created it but never recorded it")
                api.delete_keypair(kp["id"])
        for env in api.list_environments():
            if env.get("name") == settings.env_name:
                say(f"deleting environment {env['name']!r}: an interrupted up created it but never "
                         "recorded it")
                api.delete_environment(env["id"])
    except HyperstackError as exc:  # destroy reports what it could not clean up and goes on
        problems.append(f"cannot clean up {settings.env_name}: {exc}")
    return problems

def emulator_leftovers(api: Any) -> list[str]:
    """Everything still in the sandbox's own emulator."""
    try:
        envs = api.list_environments()
        keypairs = api.list_keypairs()
        vms = api.list_vms()
    except HyperstackError as exc:  # an emulator that cannot answer is a finding, not a crash
        return [f"the emulator cannot be asked ({exc})"]
    left = [f"environment {e.get('name')}" for e in envs]
    left += [f"keypair {k.get('name')}" for k in keypairs]
    left += [f"VM {v.get('name')} ({v.get('status')})" for v in vms]
    return left


def api_client(url: str, key: str) -> Any:
    from kimi_cluster.hyperstack_api.api import HyperstackClient

    return HyperstackClient(url, key, retry_base_seconds=0.2)
