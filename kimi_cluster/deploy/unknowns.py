"""Inputs not known yet: what a provider's `check` and `diff` get during a preview.

The dynamic provider host deserializes the engine's unknowns with keep_unknowns, so under the real CLI they arrive
as `pulumi.output.Unknown` objects (each a new one, equal to nothing); serialized, they are the SDK's wire string.
"""

from __future__ import annotations

from typing import Any

from pulumi.output import Unknown
from pulumi.runtime.rpc import UNKNOWN


def is_unknown(value: Any) -> bool:
    return isinstance(value, Unknown) or (isinstance(value, str) and value == UNKNOWN)
