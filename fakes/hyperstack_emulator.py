"""A local emulator of the Hyperstack API (`/v1/core/...`) for tests and the sandbox, on a stdlib HTTP server.

Same paths, payload rules, error bodies and asynchronous VM lifecycle as the real API; faults injected on demand.
"""

from __future__ import annotations

import base64
import binascii
import fnmatch
import hashlib
import ipaddress
import itertools
import json
import math
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal, Protocol
from urllib.parse import parse_qs, urlsplit

from fakes import hyperstack_drift

DEFAULT_API_KEY = "emulator-key"
# A request body larger than any the API takes (a create with user_data is a few KB) is refused unread.
MAX_BODY_BYTES = 1 << 20
# How long a client may take to send its request line, headers or body before its connection is dropped.
SOCKET_TIMEOUT_S = 30.0
# Test-only read access to the emulator's own bookkeeping, outside the API's /v1 prefix and off unless asked for.
ADMIN_PREFIX = "/_emulator/"

# --- catalog ----------------------------------------------------------------------------------------------------

REGIONS = [
    {"id": 1, "name": "CANADA-1", "description": "Canada", "country": "Canada", "green_status": "GREEN"},
    {"id": 2, "name": "NORWAY-1", "description": "Norway", "country": "Norway", "green_status": "GREEN"},
    {"id": 3, "name": "US-1", "description": "United States", "country": "USA", "green_status": "NOT_GREEN"},
]

_NETWORK_OPTIMISED = [{"id": 1, "label": "network_optimised"}]

FLAVORS: list[dict[str, Any]] = [
    # Values as a reseller's listing of Hyperstack's catalog gives them (not confirmed on an official page).
    {"id": 101, "name": "n3-H100x8-NVLink", "display_name": "n3-H100x8-NVLink", "region_name": "CANADA-1",
     "gpu": "H100-80G-PCIe-NVLink", "gpu_count": 8, "cpu": 252, "ram": 1440.0, "disk": 100, "ephemeral": 6500,
     "labels": _NETWORK_OPTIMISED},
    # docs.hyperstack.cloud/docs/hardware/flavors.
    {"id": 102, "name": "n3-H100x8", "display_name": "n3-H100x8", "region_name": "CANADA-1",
     "gpu": "H100-80G-PCIe", "gpu_count": 8, "cpu": 252, "ram": 1440.0, "disk": 100, "ephemeral": 6500,
     "labels": []},
    # ASSUMED: the region and the cpu/ram/disk/ephemeral values are not on an official page we could read;
    # the deployment guide says 224 CPUs, 1,920 GB RAM, 1,000 GB root disk, 40,000 GB ephemeral.
    {"id": 103, "name": "n3-B300-SXM6x8", "display_name": "n3-B300-SXM6x8", "region_name": "CANADA-1",
     "gpu": "B300-SXM6", "gpu_count": 8, "cpu": 224, "ram": 1920.0, "disk": 1000, "ephemeral": 40000,
     "labels": _NETWORK_OPTIMISED},
    # A small CPU flavor (documented as not supporting hibernation) so a catalog has more than GPU boxes.
    # The H100 flavor in the other regions too, so a cluster can be placed by stock (not confirmed on an official
    # page for these regions; the shape is the CANADA-1 one).
    {"id": 105, "name": "n3-H100x8-NVLink", "display_name": "n3-H100x8-NVLink", "region_name": "NORWAY-1",
     "gpu": "H100-80G-PCIe-NVLink", "gpu_count": 8, "cpu": 252, "ram": 1440.0, "disk": 100, "ephemeral": 6500,
     "labels": _NETWORK_OPTIMISED},
    {"id": 106, "name": "n3-H100x8-NVLink", "display_name": "n3-H100x8-NVLink", "region_name": "US-1",
     "gpu": "H100-80G-PCIe-NVLink", "gpu_count": 8, "cpu": 252, "ram": 1440.0, "disk": 100, "ephemeral": 6500,
     "labels": _NETWORK_OPTIMISED},
    {"id": 104, "name": "n1-cpu-small", "display_name": "n1-cpu-small", "region_name": "NORWAY-1",
     "gpu": "", "gpu_count": 0, "cpu": 4, "ram": 4.0, "disk": 100, "ephemeral": 0, "labels": []},
    # Hyperstack's flavor-labels page lists CPU-only flavors in CANADA-1 as well: the replicas' front runs on one.
    {"id": 107, "name": "n1-cpu-small", "display_name": "n1-cpu-small", "region_name": "CANADA-1",
     "gpu": "", "gpu_count": 0, "cpu": 4, "ram": 4.0, "disk": 100, "ephemeral": 0, "labels": []},
]

IMAGES: list[dict[str, Any]] = [
    {"id": 201, "name": "Ubuntu Server 24.04 LTS R570 CUDA 12.8 with Docker", "region_name": "CANADA-1"},
    {"id": 202, "name": "Ubuntu Server 24.04 LTS R595 CUDA 13.2 with Docker", "region_name": "CANADA-1"},
    {"id": 203, "name": "Ubuntu Server 22.04 LTS R570 CUDA 12.8 with Docker", "region_name": "CANADA-1"},
    {"id": 204, "name": "Ubuntu Server 24.04 LTS", "region_name": "NORWAY-1"},
    {"id": 205, "name": "Ubuntu Server 24.04 LTS R570 CUDA 12.8 with Docker", "region_name": "NORWAY-1"},
    {"id": 206, "name": "Ubuntu Server 24.04 LTS R570 CUDA 12.8 with Docker", "region_name": "US-1"},
]

# VMs of each GPU flavor a region can create when nothing of ours runs there; live VMs take from it.
DEFAULT_VMS_IN_STOCK = 16

# Hourly prices per GPU of each GPU model (what Hyperstack's pricing page quotes per GPU-hour), and a few
# non-GPU resources; the same figures as the project's catalog, so only a test that changes one sees a difference.
PRICEBOOK: list[dict[str, Any]] = [
    {"id": 1, "name": "H100-80G-PCIe-NVLink", "value": 2.60, "original_value": 2.60, "discount_applied": False},
    {"id": 2, "name": "H100-80G-PCIe", "value": 2.40, "original_value": 2.40, "discount_applied": False},
    {"id": 3, "name": "B300-SXM6", "value": 7.40, "original_value": 7.40, "discount_applied": False},
    {"id": 4, "name": "Public IP", "value": 0.00672, "original_value": 0.00672, "discount_applied": False},
    # Per VM-hour, the rate card's figure for the cheapest CPU flavor (components/catalog.py FRONT_FLAVOR).
    {"id": 5, "name": "n1-cpu-small", "value": 0.35, "original_value": 0.35, "discount_applied": False},
]

PROTOCOLS = ["any", "ah", "dccp", "egp", "esp", "gre", "hopopt", "icmp", "igmp", "ip", "ipip", "ipv6-encap",
             "ipv6-frag", "ipv6-icmp", "icmpv6", "ipv6-nonxt", "ipv6-opts", "ipv6-route", "ospf", "pgm", "rsvp",
             "sctp", "tcp", "udp", "udplite", "vrrp"]


# --- configuration and faults -----------------------------------------------------------------------------------

@dataclass
class Lifecycle:
    """Seconds spent in each asynchronous phase (tests use milliseconds)."""

    creating_seconds: float = 0.5     # CREATING -> BUILD
    build_seconds: float = 1.0        # BUILD -> ACTIVE (or ERROR)
    floating_ip_seconds: float = 0.5  # after ACTIVE: floating_ip_status ATTACHING -> ATTACHED
    deleting_seconds: float = 0.5     # DELETING -> gone (404)


@dataclass
class RateLimit:
    """The next `count` matching requests answer 429."""

    count: int
    method: str | None = None
    path: str | None = None  # glob on the path after /v1, e.g. "/core/virtual-machines*"


@dataclass
class ServerError:
    """The next `count` matching requests answer `status` (5xx) without doing anything."""

    count: int
    status: int = 500
    method: str | None = None
    path: str | None = None


@dataclass
class VmError:
    """The next created VM (or the one with this name) ends its build in ERROR."""

    name: str | None = None
    reason: str = "No valid host was found. There are not enough hosts available."


@dataclass
class StuckInBuild:
    """The next created VM (or the one with this name) never leaves BUILD."""

    name: str | None = None


@dataclass
class LostCreateResponse:
    """The next successful POST to `path` (glob) takes effect, then its answer is lost: a 500, or a dropped
    connection."""

    mode: Literal["500", "drop"] = "500"
    path: str = "/core/virtual-machines"


@dataclass
class OutOfStock:
    flavor_name: str
    region: str = "CANADA-1"


@dataclass
class RevokeKey:
    key: str


Fault = RateLimit | ServerError | VmError | StuckInBuild | LostCreateResponse | OutOfStock | RevokeKey


@dataclass
class RecordedRequest:
    method: str
    path: str  # after /v1, without the query
    query: dict[str, list[str]]
    body: Any
    authorized: bool
    status: int = 0


# --- state ------------------------------------------------------------------------------------------------------

@dataclass
class Rule:
    id: int
    direction: str
    ethertype: str
    protocol: str
    remote_ip_prefix: str
    port_range_min: int | None
    port_range_max: int | None
    created_at: str

    def fields(self) -> dict[str, Any]:
        return {"id": self.id, "direction": self.direction, "ethertype": self.ethertype, "protocol": self.protocol,
                "remote_ip_prefix": self.remote_ip_prefix, "port_range_min": self.port_range_min,
                "port_range_max": self.port_range_max, "status": "ACTIVE", "created_at": self.created_at}


@dataclass
class Vm:
    id: int
    name: str
    environment_id: int
    flavor: dict[str, Any]
    image_name: str | None
    key_name: str
    labels: list[str]
    user_data: str | None
    assign_floating_ip: bool
    fixed_ip: str
    floating_ip: str | None
    created: float
    created_at: str
    fate: Literal["active", "error", "stuck"] = "active"
    error_reason: str = ""
    deleting_since: float | None = None
    rules: dict[int, Rule] = field(default_factory=dict)
    events: list[dict[str, Any]] = field(default_factory=list)
    power: Any = None  # a stop or start behind its status (fakes/hyperstack_drift.py)


class NodeHost(Protocol):
    """Runs the machines behind the VMs: booted at create, their rules applied, ended when the VM goes."""

    def boot(self, address: str, user_data: str | None, authorized_key: str,
             rules: Iterable[Mapping[str, Any]]) -> None: ...

    def firewall(self, address: str, rules: Iterable[Mapping[str, Any]]) -> None: ...

    def shutdown(self, address: str) -> list[str]: ...


@dataclass
class EmulatorState:
    environments: dict[int, dict[str, Any]] = field(default_factory=dict)
    keypairs: dict[int, dict[str, Any]] = field(default_factory=dict)
    vms: dict[int, Vm] = field(default_factory=dict)
    stock: dict[tuple[str, str], bool] = field(default_factory=dict)
    # (region, flavor) -> VMs it can hold in all (live VMs included); DEFAULT_VMS_IN_STOCK when not set.
    capacity: dict[tuple[str, str], int] = field(default_factory=dict)
    prices: dict[str, float] = field(default_factory=dict)
    # Every VM that ever billed, by id: kept after its delete, as the billing history keeps it.
    billed: dict[int, Bill] = field(default_factory=dict)


@dataclass
class Bill:
    """One VM's bill: billed per started minute from its create until its delete (SHUTOFF would still bill; a VM that
    failed to build does not), at its flavor's pricebook rate when it was created."""

    vm_id: int
    name: str
    price_per_hour: float
    started: float
    ended: float | None = None


class ApiError(Exception):
    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.status, self.reason, self.message = status, reason, message


class _Drop(Exception):
    """Close the connection without answering (the request may already have had its effect)."""


def _now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


# --- payload validation mirroring the SDK's request models ------------------------------------------------------

@dataclass(frozen=True)
class _F:
    kind: Literal["str", "int", "bool", "strlist", "object", "objlist", "number"]
    required: bool = False
    max_length: int | None = None


_RULE = {"direction": _F("str", True), "ethertype": _F("str", True), "protocol": _F("str", True),
         "remote_ip_prefix": _F("str", True), "port_range_min": _F("int"), "port_range_max": _F("int")}

SCHEMAS: dict[str, dict[str, _F]] = {
    "CreateEnvironment": {"name": _F("str", True, 50), "region": _F("str", True)},
    "ImportKeypairPayload": {"name": _F("str", True, 50), "environment_name": _F("str", True),
                             "public_key": _F("str", True)},
    "CreateInstancesPayload": {
        "name": _F("str", True, 50), "environment_name": _F("str", True), "flavor_name": _F("str", True),
        "key_name": _F("str", True), "count": _F("int", True), "image_name": _F("str"),
        "assign_floating_ip": _F("bool"), "enable_port_randomization": _F("bool"),
        "create_bootable_volume": _F("bool"), "volume_name": _F("str"), "user_data": _F("str"),
        "callback_url": _F("str", False, 250), "labels": _F("strlist"), "security_rules": _F("objlist"),
        "enhanced_monitoring_enabled": _F("bool"), "flavor": _F("object"), "profile": _F("object"),
    },
    "CreateSecurityRulePayload": _RULE,
    "EditLabelOfAnExistingVMPayload": {"labels": _F("strlist")},
}


def _type_ok(kind: str, value: Any) -> bool:
    if kind == "str":
        return isinstance(value, str)
    if kind == "int":  # strict, like pydantic StrictInt: a bool is not an int
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "strlist":
        return isinstance(value, list) and all(isinstance(v, str) for v in value)
    if kind == "object":
        return isinstance(value, dict)
    if kind == "objlist":
        return isinstance(value, list) and all(isinstance(v, dict) for v in value)
    return False


def validate(schema_name: str, body: Any) -> dict[str, Any]:
    """Reject what the SDK's pydantic model would reject, and unknown fields (which hide client typos)."""
    schema = SCHEMAS[schema_name]
    if not isinstance(body, dict):
        raise ApiError(400, "bad_request", f"{schema_name}: the body must be a JSON object")
    unknown = sorted(set(body) - set(schema))
    if unknown:
        raise ApiError(400, "bad_request", f"{schema_name}: unknown field(s) {', '.join(unknown)}")
    for name, spec in schema.items():
        value = body.get(name)
        if value is None:
            if spec.required:
                raise ApiError(400, "bad_request", f"{schema_name}.{name}: field required")
            continue
        if not _type_ok(spec.kind, value):
            raise ApiError(400, "bad_request", f"{schema_name}.{name}: expected {spec.kind}")
        if spec.max_length is not None and len(value) > spec.max_length:
            raise ApiError(400, "bad_request",
                           f"{schema_name}.{name}: at most {spec.max_length} characters, got {len(value)}")
    return body


def _validate_rule(body: Any) -> dict[str, Any]:
    body = validate("CreateSecurityRulePayload", body)
    if body["direction"] not in ("ingress", "egress"):
        raise ApiError(400, "bad_request", "direction must be 'ingress' or 'egress'")
    if body["ethertype"] not in ("IPv4", "IPv6"):
        raise ApiError(400, "bad_request", "ethertype must be 'IPv4' or 'IPv6'")
    if body["protocol"] not in PROTOCOLS:
        raise ApiError(400, "bad_request", f"protocol must be one of {', '.join(PROTOCOLS)}")
    try:
        network = ipaddress.ip_network(body["remote_ip_prefix"], strict=False)
    except ValueError:
        raise ApiError(400, "bad_request", f"remote_ip_prefix {body['remote_ip_prefix']!r} is not a CIDR") from None
    if (network.version == 4) != (body["ethertype"] == "IPv4"):
        raise ApiError(400, "bad_request", "remote_ip_prefix does not match the ethertype")
    low, high = body.get("port_range_min"), body.get("port_range_max")
    for port in (low, high):
        if port is not None and not 1 <= port <= 65535:
            raise ApiError(400, "bad_request", "ports must be between 1 and 65535")
    if low is not None and high is not None and low > high:
        raise ApiError(400, "bad_request", "port_range_min is greater than port_range_max")
    return body


_KEY_RE = re.compile(r"^(ssh-(rsa|ed25519|dss)|ecdsa-sha2-nistp(256|384|521)|sk-\S+)\s+([A-Za-z0-9+/=]+)(\s.*)?$")


def _fingerprint(public_key: str) -> str:
    match = _KEY_RE.match(public_key.strip())
    if not match:
        raise ApiError(400, "bad_request", "public_key is not an OpenSSH public key")
    try:
        blob = base64.b64decode(match.group(4), validate=True)
    except binascii.Error:
        raise ApiError(400, "bad_request", "public_key is not valid base64") from None
    digest = hashlib.md5(blob).hexdigest()
    return ":".join(digest[i:i + 2] for i in range(0, len(digest), 2))


# --- the emulator -----------------------------------------------------------------------------------------------

class Emulator:
    """Hyperstack on loopback. `with Emulator(...) as emu:` starts it on a thread; `emu.base_url` ends in /v1."""

    # For fakes/hyperstack_drift.py, which this module imports (so it cannot import this one): its refusals and the
    # flavors a resize may pick.
    Error = ApiError
    catalog_flavors = FLAVORS

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        api_keys: tuple[str, ...] = (DEFAULT_API_KEY,),
        lifecycle: Lifecycle | None = None,
        first_ip: str = "127.0.0.2",
        first_floating_ip: str | None = None,
        vm_names_unique: bool = False,
        admin: bool = False,
        socket_timeout: float = SOCKET_TIMEOUT_S,
        nodes: NodeHost | None = None,
        billing_minute_seconds: float = 60.0,
        extra_hosts: tuple[str, ...] = (),
    ) -> None:
        self.host, self.port = host, port
        # More addresses to answer on (the sandbox's fabric bridge, where a caretaker on a fake node dials it).
        self.extra_hosts = extra_hosts
        # Hyperstack bills per minute; a test shortens the minute (a time scale, as every lifecycle figure here is).
        self.billing_minute_seconds = billing_minute_seconds
        # Where a created VM boots (fakes/node_fabric.py: a namespace with sshd at its address), if anywhere.
        self.nodes = nodes
        # No client holds a handler thread longer than this while it sends its request (or sends nothing).
        self.socket_timeout = socket_timeout
        # GET /_emulator/inventory and /_emulator/requests, for a test that runs the emulator in another process.
        self.admin = admin
        self.lifecycle = lifecycle or Lifecycle()
        # VMs get loopback addresses so fake nodes can listen on them; one address per VM is used for both
        # fixed_ip and floating_ip unless a separate floating pool is given.
        self._fixed_ips = self._ip_pool(first_ip)
        self._floating_ips = self._ip_pool(first_floating_ip) if first_floating_ip else None
        # Whether the API refuses a second VM of the same name is not documented; off by default so tests prove
        # the client avoids duplicates by itself.
        self.vm_names_unique = vm_names_unique
        self.state = EmulatorState()
        self.lock = threading.RLock()
        self._api_keys = set(api_keys)
        self._faults: list[Fault] = []
        self._requests: list[RecordedRequest] = []
        self._ids = itertools.count(1000)
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._extra_servers: list[ThreadingHTTPServer] = []

    # -- life of the server --

    def start(self) -> Emulator:
        handler = type("Handler", (_Handler,), {"emulator": self, "timeout": self.socket_timeout})
        self._server = ThreadingHTTPServer((self.host, self.port), handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="hyperstack-emulator", daemon=True)
        self._thread.start()
        for host in self.extra_hosts:  # the same state and port on another address of this machine
            extra = ThreadingHTTPServer((host, self.port), handler)
            extra.daemon_threads = True
            self._extra_servers.append(extra)
            threading.Thread(target=extra.serve_forever, kwargs={"poll_interval": 0.05},
                             name=f"hyperstack-emulator-{host}", daemon=True).start()
        return self

    def stop(self) -> None:
        for extra in self._extra_servers:
            extra.shutdown()
            extra.server_close()
        self._extra_servers.clear()
        if self._server:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def run_until_interrupted(self) -> None:
        """Serve (starting if needed) until Ctrl-C, then stop."""
        if self._server is None:
            self.start()
        assert self._thread is not None
        try:
            while self._thread.is_alive():
                self._thread.join(0.5)
        except KeyboardInterrupt:
            pass
        finally:
            self.stop()

    def __enter__(self) -> Emulator:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    # -- test controls --

    def inject(self, *faults: Fault) -> None:
        with self.lock:
            for fault in faults:
                if isinstance(fault, OutOfStock):
                    self.state.stock[(fault.region, fault.flavor_name)] = False
                elif isinstance(fault, RevokeKey):
                    self._api_keys.discard(fault.key)
                else:
                    self._faults.append(fault)

    def clear_faults(self) -> None:
        with self.lock:
            self._faults.clear()

    def add_api_key(self, key: str) -> None:
        with self.lock:
            self._api_keys.add(key)

    def set_stock(self, flavor_name: str, available: bool, region: str = "CANADA-1") -> None:
        with self.lock:
            self.state.stock[(region, flavor_name)] = available

    def set_capacity(self, flavor_name: str, vms: int, region: str = "CANADA-1") -> None:
        """How many VMs of this flavor the region can hold in all; the stocks endpoint shows what is left."""
        with self.lock:
            self.state.capacity[(region, flavor_name)] = vms

    def reclaim(self, name: str, mode: str = "delete") -> None:
        """The VM named `name` is reclaimed by the cloud: deleted (mode "delete") or left in ERROR (mode "error")."""
        status, answer = self._reclaim(name, mode)
        if status != 200:
            raise ValueError(answer["message"])

    def set_price(self, name: str, value: float) -> None:
        """A pricebook entry's value (its original_value stays the list price)."""
        with self.lock:
            self.state.prices[name] = value

    @property
    def requests(self) -> list[RecordedRequest]:
        with self.lock:
            return list(self._requests)

    def calls(self, method: str | None = None, path: str | None = None) -> list[RecordedRequest]:
        return [r for r in self.requests if _matches(r.method, r.path, method, path)]

    def clear_requests(self) -> None:
        with self.lock:
            self._requests.clear()

    def inventory(self) -> dict[str, list[dict[str, Any]]]:
        """Everything that exists right now (a VM still DELETING exists: it may still bill)."""
        with self.lock:
            self._sweep()
            envs = self.state.environments
            return {
                "environments": [{"id": e["id"], "name": e["name"], "region": e["region"]} for e in envs.values()],
                "keypairs": [{"id": k["id"], "name": k["name"], "environment": envs[k["environment_id"]]["name"]}
                             for k in self.state.keypairs.values()],
                "virtual_machines": [{"id": v.id, "name": v.name, "status": self._status(v)[0],
                                      "environment": envs[v.environment_id]["name"], "labels": list(v.labels)}
                                     for v in self.state.vms.values()],
                "security_rules": [{"vm_id": v.id, **r.fields()} for v in self.state.vms.values()
                                   for r in v.rules.values()],
            }

    # -- helpers --

    @staticmethod
    def _ip_pool(first: str):
        start = ipaddress.IPv4Address(first)
        return (str(start + i) for i in itertools.count())

    def _next_id(self) -> int:
        return next(self._ids)

    def _take_fault(self, kind: type, predicate: Callable[[Any], bool] = lambda f: True) -> Any | None:
        for fault in self._faults:
            if isinstance(fault, kind) and predicate(fault):
                if isinstance(fault, (RateLimit, ServerError)):
                    fault.count -= 1
                    if fault.count <= 0:
                        self._faults.remove(fault)
                else:
                    self._faults.remove(fault)
                return fault
        return None

    def _shutdown(self, vm: Vm) -> None:
        if self.nodes is not None:
            self.nodes.shutdown(vm.fixed_ip)

    def _firewall(self, vm: Vm) -> None:
        if self.nodes is not None and vm.fate == "active" and vm.power is None:  # a stopped node runs no firewall
            self.nodes.firewall(vm.fixed_ip, [r.fields() for r in vm.rules.values()])

    def _sweep(self) -> None:
        now = time.monotonic()
        for vm in list(self.state.vms.values()):
            if vm.deleting_since is not None and now - vm.deleting_since >= self.lifecycle.deleting_seconds:
                del self.state.vms[vm.id]

    def _status(self, vm: Vm) -> tuple[str, str | None, str | None]:
        """(status, floating_ip_status, floating_ip) derived from the clock, so no background thread is needed."""
        life = self.lifecycle
        if vm.deleting_since is not None:
            return "DELETING", None, None
        if (powered := hyperstack_drift.power_status(self, vm)) is not None:
            return powered
        age = time.monotonic() - vm.created
        if age < life.creating_seconds:
            return "CREATING", "ATTACHING" if vm.assign_floating_ip else None, None
        if age < life.creating_seconds + life.build_seconds or vm.fate == "stuck":
            return "BUILD", "ATTACHING" if vm.assign_floating_ip else None, None
        if vm.fate == "error":
            if not any(e["type"] == "error" for e in vm.events):
                vm.events.append(self._event(vm, "error", "ERROR", vm.error_reason))
            return "ERROR", None, None
        if not vm.assign_floating_ip:
            return "ACTIVE", None, None
        if age < life.creating_seconds + life.build_seconds + life.floating_ip_seconds:
            return "ACTIVE", "ATTACHING", None
        return "ACTIVE", "ATTACHED", vm.floating_ip

    def _vms_left(self, region: str, flavor: dict[str, Any]) -> int:
        """Stock of one flavor in one region: none when marked out of stock, else capacity minus live VMs."""
        key = (region, flavor["name"])
        if not self.state.stock.get(key, True):
            return 0
        used = sum(1 for v in self.state.vms.values() if v.flavor["name"] == flavor["name"]
                   and self.state.environments[v.environment_id]["region"] == region and v.deleting_since is None)
        return max(self.state.capacity.get(key, DEFAULT_VMS_IN_STOCK) - used, 0)

    @staticmethod
    def _event(vm: Vm, type_: str, reason: str, message: str) -> dict[str, Any]:
        return {"instance_id": vm.id, "message": message, "object": "instance", "org_id": 1, "reason": reason,
                "time": _now_iso(), "type": type_, "user_id": 1}

    def _env_fields(self, env: dict[str, Any]) -> dict[str, Any]:
        return {"id": env["id"], "name": env["name"], "region": env["region"], "created_at": env["created_at"],
                "features": {"network_optimised": env["region"] == "CANADA-1", "green_status": "GREEN"}}

    def _flavor_fields(self, flavor: dict[str, Any]) -> dict[str, Any]:
        key = (flavor["region_name"], flavor["name"])
        return {**flavor, "features": {}, "created_at": "2025-01-01T00:00:00+00:00",
                "stock_available": self.state.stock.get(key, True) and self._vms_left(key[0], flavor) > 0,
                "image_restrictions": {"has_image_restrictions": False, "restriction_type": None,
                                       "compatible_images": []}}

    @staticmethod
    def _image_fields(image: dict[str, Any]) -> dict[str, Any]:
        return {**image, "type": "Ubuntu", "version": image["name"].removeprefix("Ubuntu "),
                "size": 107374182400, "display_size": "100.0 GB", "description": image["name"], "is_public": True,
                "labels": [], "flavor_restrictions": {"has_flavor_restrictions": False, "restriction_type": None,
                                                      "compatible_flavors": []}}

    def _vm_fields(self, vm: Vm) -> dict[str, Any]:
        status, fip_status, floating_ip = self._status(vm)
        env = self.state.environments[vm.environment_id]
        flavor = {k: vm.flavor[k] for k in ("id", "name", "cpu", "ram", "disk", "ephemeral", "gpu", "gpu_count",
                                            "labels")}
        return {
            "id": vm.id, "name": vm.name, "status": status,
            "power_state": {"ACTIVE": "RUNNING", "SHUTOFF": "SHUTDOWN"}.get(status, "NOSTATE"),
            "vm_state": {"ACTIVE": "active", "ERROR": "error", "DELETING": "deleted", "SHUTOFF": "stopped"}.get(
                status, "building"),
            "fixed_ip": None if status == "CREATING" else vm.fixed_ip,
            "floating_ip": floating_ip, "floating_ip_status": fip_status,
            "port_randomization": False, "port_randomization_status": None,
            "requires_public_ip": vm.assign_floating_ip, "locked": False, "os": "ubuntu",
            "callback_url": None, "created_at": vm.created_at, "labels": list(vm.labels),
            "contract_id": None, "cluster_id": None, "dedicated_inference_id": None, "features": {},
            "enhanced_metrics": {"enabled": False},
            "environment": {"id": env["id"], "name": env["name"], "org_id": 1, "region": env["region"],
                            "features": self._env_fields(env)["features"]},
            "flavor": {**flavor, "features": {}},
            "image": {"name": vm.image_name}, "keypair": {"name": vm.key_name},
            "security_rules": [r.fields() for r in vm.rules.values()],
            "volume_attachments": [],
        }

    def _find_env(self, name: str) -> dict[str, Any] | None:
        return next((e for e in self.state.environments.values() if e["name"] == name), None)

    def _get_vm(self, vm_id: str) -> Vm:
        vm = self.state.vms.get(int(vm_id))
        if vm is None:
            raise ApiError(404, "not_found", f"Virtual machine with id {vm_id} does not exists")
        return vm

    # -- request dispatch (called by the handler under the lock) --

    def handle(self, method: str, raw_path: str, headers: dict[str, str], raw_body: bytes) -> tuple[int, Any]:
        parts = urlsplit(raw_path)
        if self.admin and parts.path.startswith(ADMIN_PREFIX):
            try:
                admin_body = json.loads(raw_body) if raw_body else None
            except ValueError:
                admin_body = None
            return self._admin(method, parts.path[len(ADMIN_PREFIX):], admin_body)
        path = parts.path[3:] if parts.path.startswith("/v1/") else parts.path
        query = parse_qs(parts.query)
        try:
            body = json.loads(raw_body) if raw_body else None
        except (ValueError, RecursionError):  # not JSON, not UTF-8, or nested deeper than the parser goes
            body = ...
        authorized = headers.get("api_key") in self._api_keys
        record = RecordedRequest(method, path, query, None if body is ... else body, authorized)
        with self.lock:
            self._requests.append(record)
            self._sweep()
            try:
                if self._take_fault(RateLimit, lambda f: _matches(method, path, f.method, f.path)):
                    raise ApiError(429, "rate_limited", "Too many requests: 500 per minute per IP")
                fault = self._take_fault(ServerError, lambda f: _matches(method, path, f.method, f.path))
                if fault:
                    record.status = fault.status
                    return fault.status, {"message": "Internal Server Error"}
                if not parts.path.startswith("/v1/"):
                    raise ApiError(404, "not_found", f"no route {parts.path}")
                if not authorized:
                    raise ApiError(401, "unauthorized", "Invalid or missing API key (header api_key)")
                if body is ...:
                    raise ApiError(400, "bad_request", "the body is not valid JSON")
                result = self._route(method, path, query, body)
                lost = self._take_fault(LostCreateResponse,
                                        lambda f: method == "POST" and fnmatch.fnmatch(path, f.path))
                if lost and lost.mode == "drop":
                    raise _Drop()
                if lost:
                    raise ApiError(500, "server_error", "Internal Server Error")
                record.status = 200
                return 200, result
            except ApiError as err:
                record.status = err.status
                return err.status, {"status": False, "message": err.message, "error_reason": err.reason}
            except _Drop:
                record.status = -1
                raise
            except Exception as exc:  # noqa: BLE001 - an emulator bug must surface as an answer, not a closed socket
                record.status = 500
                return 500, {"status": False, "message": f"emulator error: {exc!r}", "error_reason": "server_error"}

    def _admin(self, method: str, what: str, body: Any = None) -> tuple[int, Any]:
        """Not part of the API and not recorded among its requests: what exists, what was asked, and (for a test
        in another process) POST capacity {"region", "flavor_name", "vms"} to change a region's stock, POST faults
        {"kind", ...} to arm a fault, POST reclaim {"name", "mode"} to take a VM away."""
        if method == "POST" and what == "capacity" and isinstance(body, dict):
            self.set_capacity(str(body["flavor_name"]), int(body["vms"]), region=str(body["region"]))
            return 200, {"status": True}
        if method == "POST" and what == "reclaim" and isinstance(body, dict):
            return self._reclaim(str(body.get("name") or ""), str(body.get("mode") or "delete"))
        if method == "POST" and what == "faults" and isinstance(body, dict):
            # {"kind": "vm-error", "name": ...}: arm a fault in an emulator another process started (the sandbox's).
            kinds: dict[str, type] = {"rate-limit": RateLimit, "server-error": ServerError, "vm-error": VmError,
                                      "stuck-in-build": StuckInBuild, "lost-create": LostCreateResponse}
            fields = {k: v for k, v in body.items() if k != "kind"}
            try:
                self.inject(kinds[str(body.get("kind"))](**fields))
            except (KeyError, TypeError) as exc:
                return 400, {"status": False, "message": f"fault {body!r}: {exc} (kinds: {', '.join(kinds)})"}
            return 200, {"status": True}
        if method == "POST" and what == "drift":  # a change behind the stack's back: fakes/hyperstack_drift.py
            return hyperstack_drift.admin(self, body)
        if method == "GET" and what == "inventory":
            return 200, self.inventory()
        if method == "GET" and what == "requests":
            return 200, [{"method": r.method, "path": r.path, "status": r.status, "authorized": r.authorized}
                         for r in self.requests]
        return 404, {"message": f"no admin route {method} {ADMIN_PREFIX}{what} (inventory, requests, capacity, "
                                "reclaim, faults)"}

    def _reclaim(self, name: str, mode: str) -> tuple[int, Any]:
        """What the cloud does to a VM on a hardware fault or a maintenance reclaim: it goes (mode "delete": DELETING,
        then gone, as after a DELETE) or stays in ERROR (mode "error"), without anyone asking the API."""
        with self.lock:
            vm = next((v for v in self.state.vms.values() if v.name == name and v.deleting_since is None), None)
            if vm is None:
                return 404, {"status": False, "message": f"no live VM named {name!r}"}
            if mode == "delete":
                vm.deleting_since = time.monotonic()
                vm.events.append(self._event(vm, "warning", "RECLAIMED", "the host reclaimed this virtual machine"))
                self._end_bill(vm)
                self._shutdown(vm)
            elif mode == "error":
                vm.fate, vm.error_reason = "error", "hypervisor fault: the host of this virtual machine failed"
                self._shutdown(vm)  # the failed host ran it: its node is gone too, while the VM stays listed
            else:
                return 400, {"status": False, "message": f"mode must be delete or error, not {mode!r}"}
            return 200, {"status": True, "id": vm.id, "name": vm.name, "mode": mode}

    def _route(self, method: str, path: str, query: dict[str, list[str]], body: Any) -> Any:
        known = False
        for route_method, pattern, func in _ROUTES:
            match = pattern.fullmatch(path)
            if match:
                known = True
                if route_method == method:
                    return func(self, query, body, *match.groups())
        if known:
            raise ApiError(405, "not_allowed", f"method {method} not allowed on {path}")
        raise ApiError(404, "not_found", f"no route {path}")

    # -- endpoints --

    def regions(self, query, body):
        return {"status": True, "message": "Getting regions success", "regions": [{**r, "features": {}}
                                                                                  for r in REGIONS]}

    def protocols(self, query, body):
        return {"status": True, "message": "Success", "protocols": PROTOCOLS}

    def flavors(self, query, body):
        region = _q(query, "region")
        groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for flavor in FLAVORS:
            if region is None or flavor["region_name"] == region:
                groups.setdefault((flavor["gpu"], flavor["region_name"]), []).append(self._flavor_fields(flavor))
        data = [{"gpu": gpu, "region_name": reg, "flavors": fl} for (gpu, reg), fl in groups.items()]
        return {"status": True, "message": "Success", "data": data}

    def stocks(self, query, body):
        """Per region and GPU model: how many VMs of each size can be created now (whole 8-GPU hosts here)."""
        out = []
        for region in REGIONS:
            models: dict[str, int] = {}
            for flavor in FLAVORS:
                if flavor["region_name"] == region["name"] and flavor["gpu_count"]:
                    gpus = self._vms_left(str(region["name"]), flavor) * flavor["gpu_count"]
                    models[flavor["gpu"]] = max(models.get(flavor["gpu"], 0), gpus)
            out.append({"region": region["name"], "stock-type": "GPU", "models": [
                {"model": model, "available": f"{gpus}+" if gpus else "0", "planned_7_days": None,
                 "planned_30_days": None, "planned_100_days": None,
                 "configurations": {"1x": gpus, "2x": gpus // 2, "4x": gpus // 4, "8x": gpus // 8, "10x": 0}}
                for model, gpus in models.items()]})
        return {"stocks": out}

    def pricebook(self, query, body):
        # A bare JSON array, no status/message envelope (docs.hyperstack.cloud/docs/api-reference/get-pricebook).
        return [{**entry, "value": self.state.prices.get(entry["name"], entry["value"]), "start_time": None,
                 "end_time": None} for entry in PRICEBOOK]

    def images(self, query, body):
        region, search = _q(query, "region"), (_q(query, "search") or "").lower()
        images = [self._image_fields(i) for i in IMAGES if (region is None or i["region_name"] == region)
                  and search in i["name"].lower()]
        images, _, _ = _page(images, query, "per_page", default_size=None)
        groups: dict[str, list[dict[str, Any]]] = {}
        for image in images:
            groups.setdefault(image["region_name"], []).append(image)
        return {"status": True, "message": "Success", "images": [
            {"region_name": reg, "type": "Ubuntu", "logo": "", "images": imgs} for reg, imgs in groups.items()]}

    def create_environment(self, query, body):
        body = validate("CreateEnvironment", body)
        if body["region"] not in {r["name"] for r in REGIONS}:
            raise ApiError(400, "bad_request", f"region {body['region']} is not valid")
        if self._find_env(body["name"]):
            raise ApiError(409, "already_exist", f"Environment with name {body['name']} already exists")
        env = {"id": self._next_id(), "name": body["name"], "region": body["region"], "created_at": _now_iso()}
        self.state.environments[env["id"]] = env
        return {"status": True, "message": "Environment created successfully", "environment": self._env_fields(env)}

    def list_environments(self, query, body):
        search = (_q(query, "search") or "").lower()
        envs = [self._env_fields(e) for e in self.state.environments.values()
                if not search or search in e["name"].lower() or search in e["region"].lower()
                or search == str(e["id"])]
        page, number, size = _page(envs, query, "pageSize", default_size=None)
        return {"status": True, "message": "Success", "environments": page, "page": number, "page_size": size,
                "count": len(envs)}

    def get_environment(self, query, body, env_id):
        env = self.state.environments.get(int(env_id))
        if env is None:
            raise ApiError(404, "not_found", f"Environment with id {env_id} does not exists")
        return {"status": True, "message": "Success", "environment": self._env_fields(env)}

    def delete_environment(self, query, body, env_id):
        env = self.state.environments.get(int(env_id))
        if env is None:
            raise ApiError(404, "not_found", f"Environment with id {env_id} does not exists")
        children = [v for v in self.state.vms.values() if v.environment_id == env["id"]] + \
                   [k for k in self.state.keypairs.values() if k["environment_id"] == env["id"]]
        if children:
            raise ApiError(405, "not_allowed", f"Environment {env['name']} has attached child resources "
                                               f"({len(children)}); delete VMs and keypairs first")
        del self.state.environments[env["id"]]
        return {"status": True, "message": "Environment deleted successfully"}

    def _keypair_fields(self, kp: dict[str, Any]) -> dict[str, Any]:
        env = self._env_fields(self.state.environments[kp["environment_id"]])
        return {"id": kp["id"], "name": kp["name"], "public_key": kp["public_key"],
                "fingerprint": kp["fingerprint"], "created_at": kp["created_at"], "environment": env}

    def import_keypair(self, query, body):
        body = validate("ImportKeypairPayload", body)
        env = self._find_env(body["environment_name"])
        if env is None:
            raise ApiError(404, "not_found", f"Environment {body['environment_name']} does not exists")
        if any(k["name"] == body["name"] and k["environment_id"] == env["id"] for k in self.state.keypairs.values()):
            raise ApiError(409, "already_exist", f"Keypair with name {body['name']} already exists")
        kp = {"id": self._next_id(), "name": body["name"], "environment_id": env["id"],
              "public_key": body["public_key"], "fingerprint": _fingerprint(body["public_key"]),
              "created_at": _now_iso()}
        self.state.keypairs[kp["id"]] = kp
        return {"status": True, "message": "Keypair imported successfully", "keypair": self._keypair_fields(kp)}

    def list_keypairs(self, query, body):
        search = (_q(query, "search") or "").lower()
        kps = [self._keypair_fields(k) for k in self.state.keypairs.values()
               if not search or search in k["name"].lower()]
        page, number, size = _page(kps, query, "pageSize", default_size=None)
        return {"status": True, "message": "Success", "keypairs": page, "page": number, "page_size": size,
                "count": len(kps)}

    def delete_keypair(self, query, body, kp_id):
        if self.state.keypairs.pop(int(kp_id), None) is None:
            raise ApiError(404, "not_found", f"Keypair with id {kp_id} does not exists")
        return {"status": True, "message": "Keypair deleted successfully"}

    def create_vms(self, query, body):
        body = validate("CreateInstancesPayload", body)
        count = body["count"]
        if not 1 <= count <= 20:
            raise ApiError(400, "bad_request", "count must be between 1 and 20")
        rules = [_validate_rule(r) for r in body.get("security_rules") or []]
        env = self._find_env(body["environment_name"])
        if env is None:
            raise ApiError(404, "not_found", f"Environment {body['environment_name']} does not exists")
        if not any(k["name"] == body["key_name"] and k["environment_id"] == env["id"]
                   for k in self.state.keypairs.values()):
            raise ApiError(404, "not_found", f"Keypair {body['key_name']} not found in {env['name']}")
        flavor = next((f for f in FLAVORS if f["name"] == body["flavor_name"]
                       and f["region_name"] == env["region"]), None)
        if flavor is None:
            raise ApiError(404, "not_found", f"Flavor {body['flavor_name']} not found in {env['region']}")
        if self._vms_left(env["region"], flavor) < count:
            raise ApiError(400, "bad_request", f"No stock available for flavor {flavor['name']} in {env['region']}")
        image = body.get("image_name")
        if image is None or not any(i["name"] == image and i["region_name"] == env["region"] for i in IMAGES):
            raise ApiError(404, "not_found", f"Image {image} not found in {env['region']}")
        names = [body["name"]] if count == 1 else [f"{body['name']}-{i + 1}" for i in range(count)]
        if self.vm_names_unique and any(v.name in names and v.environment_id == env["id"]
                                        for v in self.state.vms.values()):
            raise ApiError(409, "already_exist", f"Virtual machine with name {body['name']} already exists")
        created = []
        for name in names:
            fixed_ip = next(self._fixed_ips)
            vm = Vm(id=self._next_id(), name=name, environment_id=env["id"], flavor=flavor, image_name=image,
                    key_name=body["key_name"], labels=list(body.get("labels") or []),
                    user_data=body.get("user_data"), assign_floating_ip=bool(body.get("assign_floating_ip")),
                    fixed_ip=fixed_ip,
                    floating_ip=next(self._floating_ips) if self._floating_ips else fixed_ip,
                    created=time.monotonic(), created_at=_now_iso())
            for rule in rules:
                rid = self._next_id()
                vm.rules[rid] = Rule(id=rid, created_at=_now_iso(), port_range_min=rule.get("port_range_min"),
                                     port_range_max=rule.get("port_range_max"),
                                     **{k: rule[k] for k in ("direction", "ethertype", "protocol",
                                                             "remote_ip_prefix")})
            if (fault := self._take_fault(VmError, _for_vm(name))):
                vm.fate, vm.error_reason = "error", fault.reason
            elif self._take_fault(StuckInBuild, _for_vm(name)):
                vm.fate = "stuck"
            vm.events.append(self._event(vm, "info", "CREATING", "Virtual machine creation accepted"))
            self.state.vms[vm.id] = vm
            if vm.fate != "error":  # a VM that failed to build is not charged
                self.state.billed[vm.id] = Bill(vm.id, vm.name, self._vm_price(flavor), vm.created)
            created.append(vm)
            if self.nodes is not None and vm.fate == "active":
                key = next(k for k in self.state.keypairs.values()
                           if k["name"] == body["key_name"] and k["environment_id"] == env["id"])
                try:
                    self.nodes.boot(vm.fixed_ip, vm.user_data, key["public_key"],
                                    [r.fields() for r in vm.rules.values()])
                except Exception as exc:  # noqa: BLE001 - a node that cannot boot is a VM in ERROR, as on the cloud
                    vm.fate, vm.error_reason = "error", f"the node did not boot: {exc}"
        return {"status": True, "message": "Virtual machine(s) creation initiated",
                "instances": [self._vm_fields(v) for v in created]}

    def list_vms(self, query, body):
        search = (_q(query, "search") or "").lower()
        environment = _q(query, "environment")
        exact = (_q(query, "exact_environment_match") or "").lower() == "true"
        vms = []
        for vm in sorted(self.state.vms.values(), key=lambda v: v.created):
            env_name = self.state.environments[vm.environment_id]["name"]
            if search and search not in vm.name.lower() and search != str(vm.id):
                continue
            if environment and (env_name != environment if exact else environment.lower() not in env_name.lower()):
                continue
            vms.append(self._vm_fields(vm))
        # The OpenAPI default page size for this list is 10: clients that do not page miss VMs.
        page, number, size = _page(vms, query, "pageSize", default_size=10)
        return {"status": True, "message": "Success", "instances": page, "page": number, "page_size": size,
                "count": len(vms)}

    def get_vm(self, query, body, vm_id):
        return {"status": True, "message": "Success", "instance": self._vm_fields(self._get_vm(vm_id))}

    def delete_vm(self, query, body, vm_id):
        vm = self._get_vm(vm_id)
        if self._status(vm)[0] == "CREATING":
            raise ApiError(409, "conflict", "Virtual machine is currently being created and cannot be deleted yet")
        if vm.deleting_since is None:
            vm.deleting_since = time.monotonic()
            self._end_bill(vm)
            self._shutdown(vm)
        return {"status": True, "message": "Instance is being deleted."}

    # -- billing (read-only): what each VM of this account has cost, deleted ones included --

    def _vm_price(self, flavor: dict[str, Any]) -> float:
        """The flavor's hourly price: its own pricebook entry, else its GPU model's per GPU-hour times its GPUs."""
        book = {e["name"]: self.state.prices.get(e["name"], e["value"]) for e in PRICEBOOK}
        if flavor["name"] in book:
            return float(book[flavor["name"]])
        return float(book.get(flavor["gpu"], 0.0)) * int(flavor["gpu_count"])

    def _end_bill(self, vm: Vm) -> None:
        bill = self.state.billed.get(vm.id)
        if bill is not None and bill.ended is None:
            bill.ended = time.monotonic()

    def billed_minutes(self, bill: Bill, now: float | None = None) -> int:
        """Started minutes from create to delete (or now): Hyperstack bills per minute."""
        end = bill.ended if bill.ended is not None else (time.monotonic() if now is None else now)
        return max(1, math.ceil((end - bill.started) / self.billing_minute_seconds - 1e-9))

    def vm_billing_history(self, query, body):
        """GET /billing/billing/history/virtual-machine (the SDK's get_vm_billing_history): one entry per VM, its
        rate, its usage in hours (billed minutes / 60) and its bill; `search` by name or id; `page`, `per_page`."""
        search = (_q(query, "search") or "").lower()
        rows = []
        for bill in sorted(self.state.billed.values(), key=lambda b: b.started):
            if search and search not in bill.name.lower() and search != str(bill.vm_id):
                continue
            minutes = self.billed_minutes(bill)
            rows.append({"attributes": {"infrahub_id": bill.vm_id, "id": str(bill.vm_id), "resource_name": bill.name,
                                        "status": "DELETED" if bill.ended is not None else "ACTIVE",
                                        "contract_id": None},
                         "metrics": {"price_per_hour": bill.price_per_hour, "usage_time": round(minutes / 60, 6),
                                     "incurred_bill": round(bill.price_per_hour * minutes / 60, 6)}})
        page, number, size = _page(rows, query, "per_page", default_size=100)
        pages = max(1, math.ceil(len(rows) / size)) if size else 1
        return {"status": True, "message": "Success",
                "billing_history_vm": {"billing_history": page, "org_id": 1, "total_count": len(rows),
                                       "pagination": {"page": number, "pages": pages, "per_page": size}}}

    def set_labels(self, query, body, vm_id):
        body = validate("EditLabelOfAnExistingVMPayload", body)
        vm = self._get_vm(vm_id)
        vm.labels = list(body.get("labels") or [])
        return {"status": True, "message": "Labels updated"}

    def vm_events(self, query, body, vm_id):
        vm = self._get_vm(vm_id)
        self._status(vm)
        return {"status": True, "message": "Success", "instance_events": list(vm.events)}

    def add_rule(self, query, body, vm_id):
        rule = _validate_rule(body)
        vm = self._get_vm(vm_id)
        if vm.deleting_since is not None:
            raise ApiError(404, "not_found", f"Virtual machine with id {vm_id} does not exists")
        key = tuple(rule.get(k) for k in _RULE)
        if any(tuple(getattr(r, k) for k in _RULE) == key for r in vm.rules.values()):
            raise ApiError(409, "already_exist", "Security group rule already exists")
        new = Rule(id=self._next_id(), created_at=_now_iso(), port_range_min=rule.get("port_range_min"),
                   port_range_max=rule.get("port_range_max"),
                   **{k: rule[k] for k in ("direction", "ethertype", "protocol", "remote_ip_prefix")})
        vm.rules[new.id] = new
        self._firewall(vm)
        return {"status": True, "message": "Security rule created", "security_rule": new.fields()}

    def delete_rule(self, query, body, vm_id, rule_id):
        vm = self._get_vm(vm_id)
        if vm.rules.pop(int(rule_id), None) is None:
            raise ApiError(404, "not_found", f"Security rule with id {rule_id} does not exists")
        self._firewall(vm)
        return {"status": True, "message": "Security rule deleted"}


def _for_vm(name: str) -> Callable[[Any], bool]:
    """A fault predicate: the fault names this VM, or no VM at all."""
    return lambda fault: fault.name in (None, name)


_ROUTE_TABLE: list[tuple[str, str, Callable[..., Any]]] = [
    ("GET", r"/core/regions", Emulator.regions),
    ("GET", r"/core/sg-rules-protocols", Emulator.protocols),
    ("GET", r"/core/flavors", Emulator.flavors),
    ("GET", r"/core/images", Emulator.images),
    ("GET", r"/core/stocks", Emulator.stocks),
    ("GET", r"/pricebook", Emulator.pricebook),
    ("POST", r"/core/environments", Emulator.create_environment),
    ("GET", r"/core/environments", Emulator.list_environments),
    ("GET", r"/core/environments/(\d+)", Emulator.get_environment),
    ("DELETE", r"/core/environments/(\d+)", Emulator.delete_environment),
    ("POST", r"/core/keypairs", Emulator.import_keypair),
    ("GET", r"/core/keypairs", Emulator.list_keypairs),
    ("DELETE", r"/core/keypair/(\d+)", Emulator.delete_keypair),
    ("POST", r"/core/virtual-machines", Emulator.create_vms),
    ("GET", r"/core/virtual-machines", Emulator.list_vms),
    ("GET", r"/core/virtual-machines/(\d+)", Emulator.get_vm),
    ("DELETE", r"/core/virtual-machines/(\d+)", Emulator.delete_vm),
    ("PUT", r"/core/virtual-machines/(\d+)/label", Emulator.set_labels),
    ("GET", r"/core/virtual-machines/(\d+)/events", Emulator.vm_events),
    ("POST", r"/core/virtual-machines/(\d+)/sg-rules", Emulator.add_rule),
    ("DELETE", r"/core/virtual-machines/(\d+)/sg-rules/(\d+)", Emulator.delete_rule),
    ("GET", r"/billing/billing/history/virtual-machine", Emulator.vm_billing_history),
    *hyperstack_drift.ROUTES,
]
_ROUTES: list[tuple[str, re.Pattern[str], Callable[..., Any]]] = [(m, re.compile(p), f) for m, p, f in _ROUTE_TABLE]


def _q(query: dict[str, list[str]], name: str) -> str | None:
    values = query.get(name)
    return values[0] if values else None


def _page(items: list, query: dict[str, list[str]], size_param: str,
          default_size: int | None) -> tuple[list, int | None, int | None]:
    """Slice like the API: 1-based `page`; without paging parameters the page fields echo null."""
    page_raw, size_raw = _q(query, "page"), _q(query, size_param)
    try:
        page = int(page_raw) if page_raw else None
        size = int(size_raw) if size_raw else default_size
    except ValueError:
        raise ApiError(400, "bad_request", f"page and {size_param} must be integers") from None
    if size is None:
        return items, page, None
    if size < 1 or (page is not None and page < 1):
        raise ApiError(400, "bad_request", f"page and {size_param} must be positive")
    start = ((page or 1) - 1) * size
    return items[start:start + size], page or 1, size


def _matches(method: str, path: str, want_method: str | None, want_path: str | None) -> bool:
    return (want_method is None or want_method == method) and (want_path is None or fnmatch.fnmatch(path, want_path))


class _Handler(BaseHTTPRequestHandler):
    emulator: Emulator
    protocol_version = "HTTP/1.1"
    # Headers and body go out in separate writes; with Nagle on, each answer would wait for a delayed ACK.
    disable_nagle_algorithm = True

    def _serve(self) -> None:
        raw_length = self.headers.get("Content-Length") or "0"
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            return self._refuse(411, "length_required", "send the body with a Content-Length, not chunked")
        if not raw_length.isdigit():
            return self._refuse(400, "bad_request", "Content-Length is not a non-negative integer")
        length = int(raw_length)
        if length > MAX_BODY_BYTES:
            return self._refuse(413, "payload_too_large", f"the body may be at most {MAX_BODY_BYTES} bytes")
        try:
            raw = self.rfile.read(length) if length else b""
        except OSError:  # the socket timeout (TimeoutError) or a reset: drop this client, keep serving others
            self.close_connection = True
            return
        if len(raw) < length:  # the client closed before sending what it announced
            self.close_connection = True
            return
        headers = {k.lower(): v for k, v in self.headers.items()}
        try:
            status, payload = self.emulator.handle(self.command, self.path, headers, raw)
        except _Drop:
            self.close_connection = True
            return
        self._answer(status, payload)

    def _refuse(self, status: int, reason: str, message: str) -> None:
        # The body may not have been read: the connection cannot be reused.
        self.close_connection = True
        self._answer(status, {"status": False, "message": message, "error_reason": reason})

    def _answer(self, status: int, payload: Any) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status, HTTPStatus(status).phrase if status in HTTPStatus._value2member_map_ else "")
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _serve

    def log_message(self, format: str, *args: Any) -> None:
        pass  # the request log lives in Emulator.requests
