"""The deploying side's budget check: `pulumi up` refuses a budgetUsd that the stack's GPU VMs have already spent.

The spend is read as the caretaker reads it (kimi_cluster/node/caretaker_spend.py: Hyperstack's VM billing history,
summed
over the stack's own GPU VM names), with the deploying key, before the first resource is registered: a budget that
would stop the cluster at its first poll is refused while nothing bills.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kimi_cluster.hyperstack_api.api import ApiSettings, HyperstackClient, HyperstackError
from kimi_cluster.node.caretaker_spend import spent_usd
from kimi_cluster.settings import NAMESPACE


def spent(env_name: str, gpu_vm_names: Sequence[str], client: HyperstackClient) -> float:
    """What the stack's GPU VMs (`gpu_vm_names`, in environment `env_name`) have cost so far, in US dollars."""
    return spent_usd(lambda path, query: client.request("GET", path, params=query), env_name, list(gpu_vm_names))


def budget_problem(budget_usd: float | None, env_name: str, gpu_vm_names: Sequence[str],
                   config: Mapping[str, Any]) -> str | None:
    """Why `up` must not go on with this budget (spent already, or the spend cannot be read), or None."""
    if budget_usd is None:
        return None
    try:
        with HyperstackClient.from_settings(ApiSettings.resolve(config)) as client:
            usd = spent(env_name, gpu_vm_names, client)
    except (HyperstackError, ValueError) as err:
        return (f"{NAMESPACE}:budgetUsd is set, but what the stack has spent could not be read from Hyperstack's "
                f"billing history ({err}); fix that, or remove the budget with: pulumi config rm {NAMESPACE}:budgetUsd")
    if usd >= budget_usd:
        return (f"{NAMESPACE}:budgetUsd {budget_usd:,.2f} is already spent: the stack's GPU VMs have cost "
                f"${usd:,.2f} since its first up (Hyperstack's billing history); raise it with: pulumi config set "
                f"{NAMESPACE}:budgetUsd <more>")
    return None
