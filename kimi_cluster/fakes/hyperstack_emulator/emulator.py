"""The Emulator: Hyperstack's API on loopback, for tests and the sandbox. It holds the account (a `Cloud`), the
request log and the HTTP listeners; what it does lives in the modules beside it (see
kimi_cluster/fakes/hyperstack_emulator/__init__.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from . import controls
from .billing import billed_minutes
from .dispatch import handle
from .faults import Fault
from .request_log import RecordedRequest, RequestLog
from .server import SOCKET_TIMEOUT_S, Listeners
from .state import Bill, Cloud, EmulatorState, Lifecycle, NodeHost, ip_pool
from .vms import reclaim

DEFAULT_API_KEY = "emulator-key"


class Emulator:
    """Hyperstack on loopback. `with Emulator(...) as emu:` starts it on a thread; `emu.base_url` ends in /v1."""

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
        billing_clock: Callable[[], float] = time.monotonic,
        extra_hosts: tuple[str, ...] = (),
    ) -> None:
        self.host, self.port = host, port
        # More addresses to answer on (the sandbox's fabric bridge, where a caretaker on a fake node dials it).
        self.extra_hosts = extra_hosts
        # No client holds a handler thread longer than this while it sends its request (or sends nothing).
        self.socket_timeout = socket_timeout
        # GET /_emulator/inventory and /_emulator/requests, for a test that runs the emulator in another process.
        self.admin = admin
        self.cloud = Cloud(
            lifecycle=lifecycle or Lifecycle(), api_keys=set(api_keys), fixed_ips=ip_pool(first_ip),
            floating_ips=ip_pool(first_floating_ip) if first_floating_ip else None, nodes=nodes,
            billing_minute_seconds=billing_minute_seconds, billing_clock=billing_clock, vm_names_unique=vm_names_unique)
        self.log = RequestLog(self.cloud.lock)
        self._listeners = Listeners()

    # -- the account, as tests read and tune it --

    @property
    def state(self) -> EmulatorState:
        return self.cloud.state

    @property
    def lifecycle(self) -> Lifecycle:
        """The phases' lengths; a test may change one while the emulator runs."""
        return self.cloud.lifecycle

    @property
    def lock(self) -> Any:
        return self.cloud.lock

    # -- life of the server --

    def start(self) -> Emulator:
        self.port = self._listeners.start(self.host, self.port, self.extra_hosts, self.handle, self.socket_timeout)
        return self

    def stop(self) -> None:
        self._listeners.stop()

    def run_until_interrupted(self) -> None:
        """Serve (starting if needed) until Ctrl-C, then stop."""
        if not self._listeners.running:
            self.start()
        try:
            self._listeners.wait()
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

    def handle(self, method: str, raw_path: str, headers: dict[str, str], raw_body: bytes) -> tuple[int, Any]:
        """One request (the HTTP handler calls this): kimi_cluster/fakes/hyperstack_emulator/dispatch.py."""
        return handle(self.cloud, self.log, self.admin, method, raw_path, headers, raw_body)

    # -- test controls (kimi_cluster/fakes/hyperstack_emulator/controls.py) --

    def inject(self, *faults: Fault) -> None:
        controls.inject(self.cloud, *faults)

    def clear_faults(self) -> None:
        with self.cloud.lock:
            self.cloud.faults.clear()

    def add_api_key(self, key: str) -> None:
        with self.cloud.lock:
            self.cloud.api_keys.add(key)

    def set_stock(self, flavor_name: str, available: bool, region: str = "CANADA-1") -> None:
        with self.cloud.lock:
            self.cloud.state.stock[(region, flavor_name)] = available

    def set_capacity(self, flavor_name: str, vms: int, region: str = "CANADA-1") -> None:
        """How many VMs of this flavor the region can hold in all; the stocks endpoint shows what is left."""
        controls.set_capacity(self.cloud, flavor_name, vms, region)

    def reclaim(self, name: str, mode: str = "delete") -> None:
        """The VM named `name` is reclaimed by the cloud: deleted (mode "delete") or left in ERROR (mode "error")."""
        status, answer = reclaim(self.cloud, name, mode)
        if status != 200:
            raise ValueError(answer["message"])

    def set_price(self, name: str, value: float) -> None:
        """A pricebook entry's value (its original_value stays the list price)."""
        with self.cloud.lock:
            self.cloud.state.prices[name] = value

    def billed_minutes(self, bill: Bill, now: float | None = None) -> int:
        return billed_minutes(self.cloud, bill, now)

    def inventory(self) -> dict[str, list[dict[str, Any]]]:
        return controls.inventory(self.cloud)

    # -- the request log (kimi_cluster/fakes/hyperstack_emulator/request_log.py) --

    @property
    def requests(self) -> list[RecordedRequest]:
        return self.log.all()

    def calls(self, method: str | None = None, path: str | None = None) -> list[RecordedRequest]:
        return self.log.calls(method, path)

    def clear_requests(self) -> None:
        self.log.clear()
