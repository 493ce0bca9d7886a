"""The Pulumi program, the entry: validated settings -> blueprint -> InferenceCluster -> the stack outputs other teams
consume.

Everything is validated before the first resource is registered, so bad config costs nothing. This is the one place
below the command line that holds the settings: it admits them, reads them once into the blueprint
(kimi_cluster/blueprint/), and hands the blueprint down. The project's
`__main__.py` (what the Pulumi CLI runs) calls `main()`.
"""

from __future__ import annotations

import os
from typing import Any

import pulumi

from kimi_cluster.blueprint import blueprint
from kimi_cluster.blueprint.admission import admit
from kimi_cluster.blueprint.caretaker import gpu_vm_names
from kimi_cluster.blueprint.pricing import program_quote
from kimi_cluster.deploy.cluster import InferenceCluster
from kimi_cluster.deploy.ssh_agent import dead_agent_socket
from kimi_cluster.settings import NAMESPACE, Settings, SettingsError
from kimi_cluster.settings.loader import placeholders, settings_from_pulumi


def _validated() -> tuple[Settings, dict[str, Any]]:
    """The stack's settings and secrets, or a SettingsError naming each bad key."""
    settings, secrets = settings_from_pulumi()
    settings = admit(settings)
    problems = placeholders(settings)
    if (dead_agent := dead_agent_socket(os.environ)) is not None:
        problems.append(dead_agent)
    if secrets["sshPrivateKey"] is None:
        problems.append(f"{NAMESPACE}:sshPrivateKey is required to run the node commands; set it with: "
                        f"pulumi config set --secret {NAMESPACE}:sshPrivateKey < ~/.ssh/kimi-deploy (README, "
                        "\"Real use\")")
    if not problems and settings.budget_usd is not None:
        from kimi_cluster.deploy.caretaker_guard import budget_problem

        keys = ("hyperstack:apiUrl", "hyperstack:apiKey", "hyperstack:retryBaseSeconds")
        config = {k: pulumi.runtime.get_config(k) for k in keys}
        spent = budget_problem(settings.budget_usd, settings.env_name, gpu_vm_names(settings), config)
        if spent is not None:
            problems.append(spent)
    if problems:
        raise SettingsError("refusing to deploy:\n  " + "\n  ".join(problems))
    return settings, secrets


def main() -> None:
    """Registers the whole stack with the running Pulumi engine."""
    try:
        settings, secrets = _validated()
    except SettingsError as err:
        # pulumi.RunError is the one exception the language host reports by its message alone: a bad key is the
        # user's to fix, and a traceback would bury the key's name.
        raise pulumi.RunError(str(err)) from None
    _register(settings, secrets)


def _register(settings: Settings, secrets: dict[str, Any]) -> None:
    """The settings' one way down: warnings and the cost are printed, the blueprint compiles them, and the cluster
    is made from the blueprint alone."""
    for warning in settings.warnings():
        pulumi.warn(warning)

    quote = program_quote(settings)
    pulumi.log.info(f"cost: {quote.summary()}")
    cluster = InferenceCluster("kimi", blueprint(settings, "kimi", quote), ssh_private_key=secrets["sshPrivateKey"],
                               hf_token=secrets["hfToken"], kernel_cache_credentials=secrets["kernelCacheCredentials"],
                               tls_private_key=secrets["tlsPrivateKey"], caretaker_api_key=secrets["caretakerApiKey"])
    for key, value in cluster.outputs.items():
        pulumi.export(key, value)
