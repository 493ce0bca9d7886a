"""The Hyperstack API emulator's old import path, kept so that `from fakes.hyperstack_emulator import ...` goes on
working: the emulator lives in the package fakes/hyperstack/, one concept a module (its __init__ lists them)."""

from __future__ import annotations

from fakes.hyperstack.admin import ADMIN_PREFIX
from fakes.hyperstack.catalog import DEFAULT_VMS_IN_STOCK, FLAVORS, IMAGES, PRICEBOOK, PROTOCOLS, REGIONS
from fakes.hyperstack.emulator import DEFAULT_API_KEY, Emulator
from fakes.hyperstack.faults import (
    Fault,
    LostCreateResponse,
    OutOfStock,
    RateLimit,
    RevokeKey,
    ServerError,
    StuckInBuild,
    VmError,
)
from fakes.hyperstack.payloads import SCHEMAS, validate
from fakes.hyperstack.request_log import RecordedRequest
from fakes.hyperstack.server import MAX_BODY_BYTES, SOCKET_TIMEOUT_S
from fakes.hyperstack.state import ApiError, Bill, EmulatorState, Lifecycle, NodeHost, Rule, Vm

__all__ = [
    "ADMIN_PREFIX", "DEFAULT_API_KEY", "DEFAULT_VMS_IN_STOCK", "FLAVORS", "IMAGES", "MAX_BODY_BYTES", "PRICEBOOK",
    "PROTOCOLS", "REGIONS", "SCHEMAS", "SOCKET_TIMEOUT_S", "ApiError", "Bill", "Emulator", "EmulatorState", "Fault",
    "Lifecycle", "LostCreateResponse", "NodeHost", "OutOfStock", "RateLimit", "RecordedRequest", "RevokeKey", "Rule",
    "ServerError", "StuckInBuild", "Vm", "VmError", "validate",
]
