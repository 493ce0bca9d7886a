"""What the emulated account holds: its environments, keypairs, VMs with their rules, bills and stock, and the
`Cloud` that every endpoint works on (that state, the lifecycle's timing, the armed faults, the node host)."""

from __future__ import annotations

import ipaddress
import itertools
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal, Protocol

from kimi_cluster.hyperstack_api.records import FlavorRecord, SecurityRuleRecord, VmEventRecord

from .faults import FaultBook


@dataclass
class Lifecycle:
    """Seconds spent in each asynchronous phase (tests use milliseconds)."""

    creating_seconds: float = 0.5     # CREATING -> BUILD
    build_seconds: float = 1.0        # BUILD -> ACTIVE (or ERROR)
    floating_ip_seconds: float = 0.5  # after ACTIVE: floating_ip_status ATTACHING -> ATTACHED
    deleting_seconds: float = 0.5     # DELETING -> gone (404)


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

    def fields(self) -> SecurityRuleRecord:
        return SecurityRuleRecord(
            id=self.id, direction=self.direction, ethertype=self.ethertype, protocol=self.protocol,
            remote_ip_prefix=self.remote_ip_prefix, port_range_min=self.port_range_min,
            port_range_max=self.port_range_max, status="ACTIVE", created_at=self.created_at)


@dataclass
class Vm:
    id: int
    name: str
    environment_id: int
    flavor: FlavorRecord
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
    events: list[VmEventRecord] = field(default_factory=list)
    power: Any = None  # a stop or start behind its status (power.py, drift_injection.py)


@dataclass
class Bill:
    """One VM's bill: billed per started minute from its create until its delete (SHUTOFF would still bill; a VM that
    failed to build does not), at its flavor's pricebook rate when it was created."""

    vm_id: int
    name: str
    price_per_hour: float
    started: float
    ended: float | None = None


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


class NodeHost(Protocol):
    """Runs the machines behind the VMs: booted at create, their rules applied, ended when the VM goes."""

    def boot(self, address: str, user_data: str | None, authorized_key: str,
             rules: Iterable[Mapping[str, Any]]) -> None: ...

    def firewall(self, address: str, rules: Iterable[Mapping[str, Any]]) -> None: ...

    def shutdown(self, address: str) -> list[str]: ...


class ApiError(Exception):
    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.status, self.reason, self.message = status, reason, message


class Drop(Exception):
    """Close the connection without answering (the request may already have had its effect)."""


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def ip_pool(first: str) -> Iterator[str]:
    start = ipaddress.IPv4Address(first)
    return (str(start + i) for i in itertools.count())


@dataclass
class Cloud:
    """The account behind the API: every endpoint reads and changes it under `lock`."""

    lifecycle: Lifecycle
    api_keys: set[str]
    fixed_ips: Iterator[str]
    # VMs get loopback addresses so fake nodes can listen on them; one address per VM is used for both fixed_ip and
    # floating_ip unless a separate floating pool is given.
    floating_ips: Iterator[str] | None = None
    # Where a created VM boots (kimi_cluster/fakes/node_fabric.py: a namespace with sshd at its address), if anywhere.
    nodes: NodeHost | None = None
    # Hyperstack bills per minute; a test shortens the minute (a time scale, as every lifecycle figure here is).
    billing_minute_seconds: float = 60.0
    # The clock bills run on. A test of a budget holds it and moves it a billed minute at a time, so which minute a
    # poll reads is the test's, not the machine's load.
    billing_clock: Callable[[], float] = time.monotonic
    # Whether the API refuses a second VM of the same name is not documented; off by default so tests prove the
    # client avoids duplicates by itself.
    vm_names_unique: bool = False
    state: EmulatorState = field(default_factory=EmulatorState)
    faults: FaultBook = field(default_factory=FaultBook)
    lock: threading.RLock = field(default_factory=threading.RLock)
    ids: Iterator[int] = field(default_factory=lambda: itertools.count(1000))

    def next_id(self) -> int:
        return next(self.ids)

    def shutdown(self, vm: Vm) -> None:
        if self.nodes is not None:
            self.nodes.shutdown(vm.fixed_ip)

    def firewall(self, vm: Vm) -> None:
        if self.nodes is not None and vm.fate == "active" and vm.power is None:  # a stopped node runs no firewall
            self.nodes.firewall(vm.fixed_ip, [r.fields() for r in vm.rules.values()])

    def find_env(self, name: str) -> dict[str, Any] | None:
        return next((e for e in self.state.environments.values() if e["name"] == name), None)

    def get_vm(self, vm_id: str) -> Vm:
        vm = self.state.vms.get(int(vm_id))
        if vm is None:
            raise ApiError(404, "not_found", f"Virtual machine with id {vm_id} does not exists")
        return vm
