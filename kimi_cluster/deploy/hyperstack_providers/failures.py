"""How the Hyperstack providers judge a failure: ProvisioningError says what could not be done and what is left; a
transient API error (lost answer, rate limit) is one worth looking again after."""

from __future__ import annotations

from kimi_cluster.hyperstack_api.api import HyperstackError


class ProvisioningError(Exception):
    """A resource could not be brought to (or taken out of) the wanted state; the message says what is left."""


def transient(err: HyperstackError) -> bool:
    return err.outcome_unknown or err.status == 429
