"""A random secret generated once at create time and kept, marked secret, in the stack's state.

The endpoint's API key is made this way so that `pulumi up` never serves an unauthenticated endpoint and the key
survives re-runs without pulling in another provider plugin. A new `version` (the apiKeyVersion setting) replaces it
with a new value: that is key rotation.

Stable names: state records each provider pickled by reference (module path + class name), and `destroy`
of an existing stack unpickles it from there. Never rename or move this module (`kimi_cluster.deploy.generated_secret`)
or
`_GeneratedSecretProvider`.
"""

from __future__ import annotations

import secrets
from typing import Any

import pulumi
import pulumi.dynamic as dyn

from kimi_cluster.deploy.unknowns import is_unknown


class _GeneratedSecretProvider(dyn.ResourceProvider):
    """Stateless: holds nothing on self, so nothing sensitive is pickled into the provider blob."""

    # Not a secret (see kimi_cluster.deploy.hyperstack_providers.providers.HyperstackProvider): stateless, pickled
    # by reference, and its diff never reads `__provider`.
    serialize_as_secret_always = False


    def create(self, props: dict[str, Any]) -> dyn.CreateResult:
        length = int(props.get("length") or 32)
        version = int(props.get("version") or 1)
        value = secrets.token_urlsafe(length)
        return dyn.CreateResult(id_=f"secret-{secrets.token_hex(4)}",
                                outs={"length": length, "version": version, "value": value})

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> dyn.DiffResult:
        # State written before `version` existed holds none: that was version 1.
        replaces = [k for k, default in (("length", 32), ("version", 1))
                    if is_unknown(news.get(k)) or int(olds.get(k) or default) != int(news.get(k) or default)]
        return dyn.DiffResult(changes=bool(replaces), replaces=replaces, delete_before_replace=False)


class GeneratedSecret(dyn.Resource, module="kimi", name="GeneratedSecret"):
    """`value` is a url-safe random string; it is a secret output and never a plain input anywhere."""

    value: pulumi.Output[str]

    def __init__(self, name: str, length: int = 32, version: int = 1,
                 opts: pulumi.ResourceOptions | None = None) -> None:
        opts = pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(additional_secret_outputs=["value"]))
        super().__init__(_GeneratedSecretProvider(), name, {"length": length, "version": version, "value": None}, opts)
