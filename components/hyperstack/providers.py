"""Pulumi dynamic providers for Hyperstack environments, keypairs, VMs and per-VM firewall rules.

Stateless: every call builds its client from the stack config given to configure() or the environment.

Firewall design: one `SecurityRule` resource per rule, attached to one VM through
`/core/virtual-machines/{vm_id}/sg-rules`. Each rule is then an independent object with its own id and its own
create/delete call, so changing the operator CIDR replaces that rule and nothing else. A cluster Firewall object
would make every rule a child of one shared object whose VM set is written by `attach-firewalls`, an endpoint with
replace semantics ("any firewalls not included will be detached"): a rule change would rewrite shared state and a
partial failure could detach protection from a running VM. Per-VM rules cost one API call per rule and node, a few
dozen calls for a cluster, well inside the 500 requests/minute budget.

Stable names: state records each provider pickled by reference (module path + class name), and `destroy`
of an existing stack unpickles it from there. Never rename or move this module (`components.hyperstack.providers`) or
its `*Provider` classes.
"""

from __future__ import annotations

import hashlib
import ipaddress
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any, Generic, TypeVar

import pulumi
from pulumi.dynamic import (
    CheckFailure,
    CheckResult,
    ConfigureRequest,
    CreateResult,
    DiffResult,
    ReadResult,
    ResourceProvider,
    UpdateResult,
)
from pulumi.runtime.rpc import UNKNOWN as _UNKNOWN  # an input not known yet (preview)

from .api import (
    API_KEY_CONFIG,
    API_URL_CONFIG,
    RETRY_BASE_CONFIG,
    EnvironmentRecord,
    HyperstackClient,
    HyperstackError,
    KeypairRecord,
    SecurityRuleRecord,
    Settings,
    VmRecord,
)

T = TypeVar("T")

# Stack config handed to configure() by the dynamic provider host. Module state of the host process, never an
# attribute of a provider object: provider objects are pickled into the Pulumi state.
_HOST_CONFIG: dict[str, Any] = {}
_CONFIG_KEYS = (API_URL_CONFIG, API_KEY_CONFIG, RETRY_BASE_CONFIG)

PROTOCOLS = frozenset({"any", "ah", "dccp", "egp", "esp", "gre", "hopopt", "icmp", "igmp", "ip", "ipip",
                       "ipv6-encap", "ipv6-frag", "ipv6-icmp", "icmpv6", "ipv6-nonxt", "ipv6-opts", "ipv6-route",
                       "ospf", "pgm", "rsvp", "sctp", "tcp", "udp", "udplite", "vrrp"})
NAME_MAX = 50  # CreateEnvironment / ImportKeypairPayload / CreateInstancesPayload: name max_length
_GONE = ("DELETING", "DELETED")


class ProvisioningError(Exception):
    """A resource could not be brought to (or taken out of) the wanted state; the message says what is left."""


def stack_config() -> dict[str, Any]:
    """The hyperstack:* values configure() received; Settings.resolve falls back to the environment."""
    return {key: _HOST_CONFIG[key] for key in _CONFIG_KEYS if _HOST_CONFIG.get(key) is not None}


def client() -> HyperstackClient:
    return HyperstackClient.from_settings(Settings.resolve(stack_config()), log=pulumi.log.info)


@dataclass(frozen=True)
class Look(Generic[T]):
    """One look at what poll() waits for: `value` once the wait is over; `state`, short, is logged whenever it
    changes, with `waiting_for` (what has to happen next); `seen`, everything looked at, goes into the timeout
    error."""

    state: str
    value: T | None = None
    waiting_for: str = ""
    seen: str = ""


def poll(subject: str, what: str, timeout: float, interval: float, probe: Callable[[], Look[T]]) -> T:
    """Call `probe` until it returns a value; give up at the deadline naming what and what was last seen.

    Each change of state is logged through pulumi.log.info with the time waited so far and what comes next: under
    the Pulumi CLI these lines are the only sign of life during a VM boot. The first waits are short and double up
    to `interval`: many transitions (a floating IP attaching, a deleted VM answering 404) finish within seconds, and
    four extra GETs are far inside the 500 requests/minute budget.
    """
    started = time.monotonic()
    deadline = started + timeout
    wait = min(1.0, interval)
    last: str | None = None
    while True:
        look = probe()
        if look.state != last:
            _log_change(subject, last, look, time.monotonic() - started)
            last = look.state
        if look.value is not None:
            return look.value
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise ProvisioningError(
                f"gave up after {timeout:g} s waiting for {what} (last seen: {look.seen or look.state})")
        time.sleep(min(wait, remaining))
        wait = min(wait * 2, interval)


def _log_change(subject: str, before: str | None, look: Look[Any], elapsed: float) -> None:
    if before is None:
        if look.value is None:  # a wait that is over at the first look needs no sign of life
            pulumi.log.info(f"{subject}: {look.state}; waiting for {look.waiting_for}")
        return
    line = f"{subject}: {before} → {look.state} after {_duration(elapsed)}"
    pulumi.log.info(line + (f"; waiting for {look.waiting_for}" if look.value is None else ""))


def _duration(seconds: float) -> str:
    """3 min 10 s, 42 s, 1 h 5 min: how long a wait has lasted, as a person would say it."""
    total = int(round(seconds))
    if total < 60:
        return f"{total} s"
    if total < 3600:
        return f"{total // 60} min {total % 60} s"
    return f"{total // 3600} h {total % 3600 // 60} min"


def _transient(err: HyperstackError) -> bool:
    return err.outcome_unknown or err.status == 429


def _int(value: Any) -> int:
    return int(float(value)) if isinstance(value, (int, float)) else int(str(value))


def _known(value: Any) -> bool:
    return value is not None and value != _UNKNOWN


def _name_failures(props: Mapping[str, Any], *keys: str) -> list[CheckFailure]:
    failures = []
    for key in keys:
        value = props.get(key)
        if value is None:
            failures.append(CheckFailure(key, f"{key} is required"))
        elif value == _UNKNOWN:
            continue
        elif not isinstance(value, str) or not value.strip():
            failures.append(CheckFailure(key, f"{key} must be a non-empty string"))
        elif key == "name" and len(value) > NAME_MAX:
            failures.append(CheckFailure(key, f"{key} is {len(value)} characters; Hyperstack allows {NAME_MAX}"))
    return failures


def _require_valid(provider: ResourceProvider, props: dict[str, Any]) -> None:
    failures = provider.check({}, props).failures
    if failures:
        raise ProvisioningError("; ".join(f"{f.property}: {f.reason}" for f in failures))


def _diff(olds: Mapping[str, Any], news: Mapping[str, Any], replace: tuple[str, ...], update: tuple[str, ...],
          delete_before_replace: bool) -> DiffResult:
    replaces = [k for k in replace if olds.get(k) != news.get(k)]
    updates = [k for k in update if olds.get(k) != news.get(k)]
    return DiffResult(changes=bool(replaces or updates), replaces=replaces,
                      delete_before_replace=delete_before_replace if replaces else None)


def _timings(spec: Any, props: Mapping[str, Any]) -> dict[str, float]:
    """The `*_seconds` inputs of `spec` (a dataclass) from `props`; a missing or empty one takes the spec's default
    (a dataclass keeps each field's default as a class attribute)."""
    return {f.name: float(props.get(f.name) or getattr(spec, f.name)) for f in fields(spec)
            if f.name.endswith("_seconds")}


class _Provider(ResourceProvider):
    def configure(self, req: ConfigureRequest) -> None:
        for key in _CONFIG_KEYS:
            value = req.config.get(key)
            if value is not None:
                _HOST_CONFIG[key] = value


# --- Environment --------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class EnvironmentSpec:
    """An environment's inputs. The timing defaults here are the only ones: resources.py refers to them."""

    name: str
    region: str
    delete_timeout_seconds: float = 300.0
    poll_interval_seconds: float = 5.0

    @classmethod
    def from_props(cls, props: Mapping[str, Any]) -> EnvironmentSpec:
        return cls(name=props["name"], region=props["region"], **_timings(cls, props))


_ENV_INPUTS = ("name", "region", "delete_timeout_seconds", "poll_interval_seconds")


class EnvironmentProvider(_Provider):
    """An environment: a named, region-bound container for keypairs and VMs."""

    def check(self, _olds: dict[str, Any], news: dict[str, Any]) -> CheckResult:
        return CheckResult(news, _name_failures(news, "name", "region"))

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        # Names are unique across the organisation, so the old one must go before its successor is created.
        return _diff(olds, news, ("name", "region"), ("delete_timeout_seconds", "poll_interval_seconds"), True)

    def create(self, props: dict[str, Any]) -> CreateResult:
        _require_valid(self, props)
        spec = EnvironmentSpec.from_props(props)
        with client() as api:
            regions = sorted(r.get("name", "") for r in api.list_regions())
            if spec.region not in regions:
                raise ProvisioningError(f"unknown region {spec.region!r}; Hyperstack offers: {', '.join(regions)}")
            env = self._find(api, spec)
            if env is None:
                try:
                    env = api.create_environment(spec.name, spec.region)
                except HyperstackError as err:
                    # Lost answer or a name taken by our own earlier, interrupted run: look before failing.
                    if not (_transient(err) or err.status == 409):
                        raise
                    env = self._find(api, spec)
                    if env is None:
                        raise
        return CreateResult(str(env["id"]), self._outs(spec, env))

    @staticmethod
    def _find(api: HyperstackClient, spec: EnvironmentSpec) -> EnvironmentRecord | None:
        env = next((e for e in api.list_environments(search=spec.name) if e.get("name") == spec.name), None)
        if env is not None and env.get("region") != spec.region:
            raise ProvisioningError(
                f"environment {spec.name!r} already exists in {env.get('region')}, not {spec.region}; environment "
                "names are unique across the organisation: choose another name or delete that environment")
        return env

    @staticmethod
    def _outs(spec: EnvironmentSpec, env: Mapping[str, Any]) -> dict[str, Any]:
        return {**{k: getattr(spec, k) for k in _ENV_INPUTS}, "environment_id": str(env["id"]),
                "name": env.get("name", spec.name), "region": env.get("region", spec.region)}

    def read(self, id_: str, props: dict[str, Any]) -> ReadResult:
        with client() as api:
            try:
                env = api.get_environment(_int(id_))
            except HyperstackError as err:
                if err.not_found:
                    return ReadResult("", {})
                raise
        spec = EnvironmentSpec.from_props({**props, "name": env["name"], "region": env["region"]})
        outs = self._outs(spec, env)
        return ReadResult(id_, outs, {k: outs[k] for k in _ENV_INPUTS})

    def update(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        return UpdateResult({**olds, **{k: news[k] for k in _ENV_INPUTS if k in news}})

    def delete(self, id_: str, props: dict[str, Any]) -> None:
        timings = _timings(EnvironmentSpec, props)
        name = props.get("name", id_)
        with client() as api:
            def attempt() -> Look[bool]:
                try:
                    api.delete_environment(_int(id_))
                except HyperstackError as err:
                    if err.not_found:
                        return Look("gone", True)
                    # 405 not_allowed: VMs or keypairs are still draining out of the environment.
                    if err.status == 405:
                        return Look("deletion refused (VMs or keypairs still in it)", None,
                                    "its VMs and keypairs to be gone", str(err))
                    if _transient(err):
                        return _unanswered(err, "the API to accept the deletion")
                    raise
                return Look("deleted", True)

            subject = f"environment {name!r}"
            poll(subject, f"{subject} to accept deletion (its VMs and keypairs must be gone first)",
                 timings["delete_timeout_seconds"], timings["poll_interval_seconds"], attempt)


# --- Keypair ------------------------------------------------------------------------------------------------------

_KEYPAIR_INPUTS = ("name", "environment_name", "public_key")


def _key_body(public_key: str) -> str:
    """Type and key material, without the comment: what identifies a public key."""
    return " ".join(public_key.split()[:2])


class KeypairProvider(_Provider):
    """Imports an OpenSSH public key into an environment. The public key is not a secret and lives in state."""

    def check(self, _olds: dict[str, Any], news: dict[str, Any]) -> CheckResult:
        failures = _name_failures(news, "name", "environment_name", "public_key")
        key = news.get("public_key")
        if _known(key) and isinstance(key, str) and "PRIVATE KEY" in key:
            # Refuse before it reaches the state file or the API.
            failures.append(CheckFailure("public_key", "this is a private key; pass the public (.pub) key"))
        elif _known(key) and isinstance(key, str) and len(key.split()) < 2:
            failures.append(CheckFailure("public_key", "expected an OpenSSH public key: '<type> <base64> [comment]'"))
        return CheckResult(news, failures)

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        # The key's comment is not part of its identity (the API may not keep it): ignore it.
        olds = {**olds, "public_key": _key_body(str(olds.get("public_key") or ""))}
        news = {**news, "public_key": _key_body(str(news.get("public_key") or ""))}
        return _diff(olds, news, _KEYPAIR_INPUTS, (), True)

    def create(self, props: dict[str, Any]) -> CreateResult:
        _require_valid(self, props)
        name, env_name, public_key = (props[k] for k in _KEYPAIR_INPUTS)
        with client() as api:
            keypair = self._find(api, name, env_name, public_key)
            if keypair is None:
                try:
                    keypair = api.import_keypair(name, env_name, public_key)
                except HyperstackError as err:
                    if not (_transient(err) or err.status == 409):
                        raise
                    keypair = self._find(api, name, env_name, public_key)
                    if keypair is None:
                        raise
        return CreateResult(str(keypair["id"]), self._outs(props, keypair))

    @staticmethod
    def _find(api: HyperstackClient, name: str, env_name: str, public_key: str) -> KeypairRecord | None:
        for keypair in api.list_keypairs(search=name):
            if keypair.get("name") == name and (keypair.get("environment") or {}).get("name") == env_name:
                if _key_body(keypair.get("public_key", "")) != _key_body(public_key):
                    raise ProvisioningError(
                        f"keypair {name!r} already exists in environment {env_name!r} with another public key "
                        f"(fingerprint {keypair.get('fingerprint')}); delete it or choose another name")
                return keypair
        return None

    @staticmethod
    def _outs(props: Mapping[str, Any], keypair: Mapping[str, Any]) -> dict[str, Any]:
        return {**{k: props[k] for k in _KEYPAIR_INPUTS}, "keypair_id": str(keypair["id"]),
                "name": keypair.get("name", props["name"]), "fingerprint": keypair.get("fingerprint")}

    def read(self, id_: str, props: dict[str, Any]) -> ReadResult:
        # There is no GET-by-id for keypairs: list and pick ours.
        with client() as api:
            keypair = next((k for k in api.list_keypairs(search=props.get("name")) if str(k.get("id")) == id_), None)
        if keypair is None:
            return ReadResult("", {})
        public_key = keypair.get("public_key") or props.get("public_key") or ""
        if _key_body(public_key) == _key_body(str(props.get("public_key") or "")):
            public_key = props["public_key"]
        live = {"name": keypair.get("name"), "environment_name": (keypair.get("environment") or {}).get("name"),
                "public_key": public_key}
        outs = self._outs(live, keypair)
        return ReadResult(id_, outs, live)

    def delete(self, id_: str, props: dict[str, Any]) -> None:
        with client() as api:
            try:
                api.delete_keypair(_int(id_))
            except HyperstackError as err:
                if not err.not_found:
                    raise


# --- VirtualMachine -----------------------------------------------------------------------------------------------

_VM_REPLACE = ("name", "environment_name", "region", "flavor_name", "image_name", "key_name", "user_data",
               "assign_floating_ip")
_VM_UPDATE = ("labels", "create_timeout_seconds", "poll_interval_seconds", "delete_timeout_seconds")
_VM_INPUTS = _VM_REPLACE + _VM_UPDATE


@dataclass(frozen=True)
class VmSpec:
    """A VM's inputs. The timing defaults here are the only ones: resources.py refers to them."""

    name: str
    environment_name: str
    region: str
    flavor_name: str
    image_name: str
    key_name: str
    labels: tuple[str, ...] = ()
    user_data: str | None = None
    assign_floating_ip: bool = True
    create_timeout_seconds: float = 1800.0
    poll_interval_seconds: float = 10.0
    delete_timeout_seconds: float = 900.0

    @classmethod
    def from_props(cls, props: Mapping[str, Any]) -> VmSpec:
        return cls(
            name=props["name"], environment_name=props["environment_name"], region=props["region"],
            flavor_name=props["flavor_name"], image_name=props["image_name"], key_name=props["key_name"],
            labels=tuple(props.get("labels") or ()), user_data=props.get("user_data"),
            assign_floating_ip=bool(props.get("assign_floating_ip", True)),
            **_timings(cls, props),
        )

    def echoed_inputs(self) -> dict[str, Any]:
        """The inputs repeated in the outputs (Pulumi diffs against outputs); user_data only as a digest."""
        return {k: (list(getattr(self, k)) if k == "labels" else getattr(self, k))
                for k in _VM_INPUTS if k != "user_data"}


def _user_data_digest(props: Mapping[str, Any]) -> str | None:
    """user_data may carry secrets (a host key): outputs keep only its SHA-256, enough to detect a change."""
    value = props.get("user_data")
    if value == _UNKNOWN:
        return _UNKNOWN
    if value is not None:
        return hashlib.sha256(str(value).encode()).hexdigest()
    return props.get("user_data_sha256")


def _vm_outs(spec: VmSpec, vm: Mapping[str, Any], user_data_sha256: str | None) -> dict[str, Any]:
    return {
        **spec.echoed_inputs(),
        "user_data_sha256": user_data_sha256,
        "vm_id": str(vm["id"]),
        "public_ip": vm.get("floating_ip"),
        "private_ip": vm.get("fixed_ip"),
        "status": vm.get("status"),
        "flavor_name": (vm.get("flavor") or {}).get("name") or spec.flavor_name,
    }


def _describe(vm: Mapping[str, Any]) -> str:
    return (f"status={vm.get('status')} vm_state={vm.get('vm_state')} power_state={vm.get('power_state')} "
            f"floating_ip_status={vm.get('floating_ip_status')} floating_ip={vm.get('floating_ip')}")


def delete_vm_and_wait(api: HyperstackClient, vm_id: int, what: str, timeout: float, interval: float) -> None:
    """DELETE (retrying while the API says the VM is still being created), then wait for GET to answer 404."""
    deadline = time.monotonic() + timeout

    def attempt() -> Look[bool]:
        try:
            api.delete_vm(vm_id)
        except HyperstackError as err:
            if err.not_found:
                return Look("gone", True)
            # The API refuses to delete a VM that is still CREATING; 409 is what it declares for that.
            if err.status == 409 or "being created" in err.message.lower():
                return Look("deletion refused (still being created)", None, "the API to accept the deletion",
                            str(err))
            if _transient(err):
                return _unanswered(err, "the API to accept the deletion")
            raise
        return Look("deletion accepted", True)

    poll(what, f"{what} to accept deletion", timeout, interval, attempt)

    def gone() -> Look[bool]:
        try:
            vm = api.get_vm(vm_id)
        except HyperstackError as err:
            if err.not_found:
                return Look("gone (GET answers 404)", True)
            if _transient(err):
                return _unanswered(err, "GET to answer 404")
            raise
        return Look(str(vm.get("status")), None, "GET to answer 404", _describe(vm))

    poll(what, f"{what} to disappear after deletion (GET answering 404)",
         max(deadline - time.monotonic(), interval), interval, gone)


def _unanswered(err: HyperstackError, waiting_for: str) -> Look[Any]:
    """A look that got no usable answer (timeout, 5xx, 429): try again."""
    return Look(f"no answer ({err.error_reason})", None, waiting_for, str(err))


class VirtualMachineProvider(_Provider):
    """One VM, created with a deterministic name and labels, adopted rather than duplicated, never left orphaned."""

    def check(self, _olds: dict[str, Any], news: dict[str, Any]) -> CheckResult:
        failures = _name_failures(news, "name", "environment_name", "region", "flavor_name", "image_name",
                                  "key_name")
        labels = news.get("labels")
        if _known(labels) and not (isinstance(labels, list) and all(isinstance(x, str) for x in labels)):
            failures.append(CheckFailure("labels", "labels must be a list of strings"))
        for key in ("create_timeout_seconds", "poll_interval_seconds", "delete_timeout_seconds"):
            value = news.get(key)
            if _known(value) and not (isinstance(value, (int, float)) and value > 0):
                failures.append(CheckFailure(key, f"{key} must be a positive number of seconds"))
        return CheckResult(news, failures)

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        # The name is deterministic and adoption goes by name: the old VM must be gone before its replacement is
        # created, or the replacement would adopt the VM that is about to be deleted.
        olds = {**olds, "user_data": _user_data_digest(olds)}
        news = {**news, "user_data": _user_data_digest(news)}
        lost = self._lost(_id)
        if lost:
            # The cloud took it away (a reclaim, a hardware fault): `pulumi up` alone brings it back, no refresh needed.
            pulumi.log.warn(f"VM {news.get('name') or _id} (id {_id}) {lost}: it is created again")
            return DiffResult(changes=True, replaces=["name"], delete_before_replace=True)
        return _diff(olds, news, _VM_REPLACE, _VM_UPDATE, True)

    @staticmethod
    def _lost(id_: str) -> str | None:
        """Why the VM with this id is gone or dead (404, DELETING, ERROR), or None; an unreadable API says nothing:
        the diff then goes by the inputs alone, as without this check."""
        if not id_ or not str(id_).isdigit():
            return None
        try:
            with client() as api:
                vm = api.get_vm(_int(id_))
        except HyperstackError as err:
            return "no longer exists (the API answers 404)" if err.not_found else None
        status = str(vm.get("status") or "")
        if status in _GONE:
            return f"is {status} although nothing here deleted it"
        if status == "ERROR":
            return "is in ERROR"
        return None

    def create(self, props: dict[str, Any]) -> CreateResult:
        _require_valid(self, props)
        spec = VmSpec.from_props(props)
        with client() as api:
            self._preflight(api, spec)
            vm = self._adopt(api, spec)
            if vm is None:
                vm = self._post(api, spec)
            try:
                vm = self._wait_ready(api, spec, vm)
            except Exception as exc:
                # Raising from create records nothing in state: a VM left behind here would bill untracked.
                raise ProvisioningError(f"{exc}; {self._cleanup(api, spec, vm)}") from exc
        return CreateResult(str(vm["id"]), _vm_outs(spec, vm, _user_data_digest(props)))

    # Everything before the POST is read-only, so a bad flavor, image or region costs nothing.
    @staticmethod
    def _preflight(api: HyperstackClient, spec: VmSpec) -> None:
        flavors = api.list_flavors(spec.region)
        if not flavors:
            regions = sorted(r.get("name", "") for r in api.list_regions())
            if spec.region not in regions:
                raise ProvisioningError(f"unknown region {spec.region!r}; Hyperstack offers: {', '.join(regions)}")
            raise ProvisioningError(f"region {spec.region} offers no flavors right now")
        in_stock = sorted(f["name"] for f in flavors if f.get("stock_available"))
        flavor = next((f for f in flavors if f.get("name") == spec.flavor_name), None)
        if flavor is None:
            raise ProvisioningError(
                f"flavor {spec.flavor_name!r} is not offered in {spec.region}; offered: "
                f"{', '.join(sorted(f['name'] for f in flavors))} (in stock: {', '.join(in_stock) or 'none'})")
        if not flavor.get("stock_available"):
            raise ProvisioningError(
                f"flavor {spec.flavor_name!r} is out of stock in {spec.region}; in stock now: "
                f"{', '.join(in_stock) or 'none'}")
        images = sorted({i.get("name", "") for i in api.list_images(spec.region)})
        if spec.image_name not in images:
            raise ProvisioningError(
                f"image {spec.image_name!r} is not available in {spec.region}; available: {', '.join(images)}")
        envs = [e for e in api.list_environments(search=spec.environment_name)
                if e.get("name") == spec.environment_name]
        if not envs:
            raise ProvisioningError(f"environment {spec.environment_name!r} does not exist")
        if envs[0].get("region") != spec.region:
            raise ProvisioningError(f"environment {spec.environment_name!r} is in {envs[0].get('region')}, "
                                    f"but the VM asks for region {spec.region}")

    @staticmethod
    def _find(api: HyperstackClient, spec: VmSpec) -> list[VmRecord]:
        return [vm for vm in api.list_vms(search=spec.name, environment=spec.environment_name)
                if vm.get("name") == spec.name
                and (vm.get("environment") or {}).get("name") == spec.environment_name
                and vm.get("status") not in _GONE]

    def _adopt(self, api: HyperstackClient, spec: VmSpec) -> VmRecord | None:
        """A VM with our name and labels is one an earlier run created and never recorded: take it over."""
        found = self._find(api, spec)
        if not found:
            return None
        if len(found) > 1:
            raise ProvisioningError(
                f"{len(found)} VMs named {spec.name!r} exist in {spec.environment_name!r} (ids "
                f"{', '.join(str(v['id']) for v in found)}); delete the extra ones, then run again")
        vm = found[0]
        missing = set(spec.labels) - set(vm.get("labels") or [])
        if missing:
            raise ProvisioningError(
                f"a VM named {spec.name!r} (id {vm['id']}) already exists in {spec.environment_name!r} without our "
                f"labels {sorted(missing)}; refusing to adopt or duplicate it: rename or delete it")
        flavor = (vm.get("flavor") or {}).get("name")
        image = (vm.get("image") or {}).get("name")
        if flavor != spec.flavor_name or image != spec.image_name:
            raise ProvisioningError(
                f"VM {spec.name!r} (id {vm['id']}) from an earlier interrupted run has flavor {flavor} and image "
                f"{image}, but {spec.flavor_name} and {spec.image_name} are wanted; delete it, then run again")
        if vm.get("status") == "ERROR":
            pulumi.log.warn(f"VM {spec.name!r} (id {vm['id']}) left by an earlier run is in ERROR: deleting it")
            delete_vm_and_wait(api, vm["id"], f"VM {spec.name!r} (id {vm['id']})",
                               spec.delete_timeout_seconds, spec.poll_interval_seconds)
            return None
        pulumi.log.warn(f"adopting VM {spec.name!r} (id {vm['id']}), created by an earlier run that did not finish")
        return vm

    def _post(self, api: HyperstackClient, spec: VmSpec) -> VmRecord:
        try:
            return api.create_vm(name=spec.name, environment_name=spec.environment_name,
                                 flavor_name=spec.flavor_name, image_name=spec.image_name, key_name=spec.key_name,
                                 labels=spec.labels, user_data=spec.user_data,
                                 assign_floating_ip=spec.assign_floating_ip)
        except HyperstackError as err:
            if not err.outcome_unknown:
                raise  # a 4xx answer means nothing was created
            # The VM may exist although the answer was lost: look it up, never send a second create.
            for _ in range(3):
                found = self._find(api, spec)
                if found:
                    pulumi.log.warn(f"the create answer for VM {spec.name!r} was lost ({err}); adopting id "
                                    f"{found[0]['id']}")
                    return found[0]
                time.sleep(spec.poll_interval_seconds)
            raise ProvisioningError(
                f"creating VM {spec.name!r} had an unknown outcome ({err}) and no VM of that name appeared; "
                "run `pulumi up` again: it looks the VM up by name before creating one") from err

    @staticmethod
    def _wait_ready(api: HyperstackClient, spec: VmSpec, vm: VmRecord) -> VmRecord:
        vm_id = vm["id"]

        def probe() -> Look[VmRecord]:
            try:
                current = api.get_vm(vm_id)
            except HyperstackError as err:
                if _transient(err):
                    return _unanswered(err, "ACTIVE")
                raise
            status = current.get("status")
            if status == "ERROR":
                try:
                    events = api.vm_events(vm_id)
                except HyperstackError:
                    events = []
                reasons = "; ".join(f"{e.get('reason')}: {e.get('message')}" for e in events
                                    if e.get("type") == "error" or e.get("reason") == "ERROR") or "no event text"
                raise ProvisioningError(f"VM {spec.name!r} (id {vm_id}) went to ERROR while being created "
                                        f"({_describe(current)}); events: {reasons}")
            if status in _GONE:
                raise ProvisioningError(f"VM {spec.name!r} (id {vm_id}) is being deleted by someone else")
            if status != "ACTIVE":
                return Look(str(status), None, "ACTIVE", _describe(current))
            if current.get("floating_ip") or not spec.assign_floating_ip:
                return Look("ACTIVE", current, "", _describe(current))
            return Look("ACTIVE without its floating IP", None, "the floating IP", _describe(current))

        what = f"VM {spec.name!r} (id {vm_id}) to be ACTIVE" + (
            " with its floating IP attached" if spec.assign_floating_ip else "")
        return poll(spec.name, what, spec.create_timeout_seconds, spec.poll_interval_seconds, probe)

    @staticmethod
    def _cleanup(api: HyperstackClient, spec: VmSpec, vm: VmRecord) -> str:
        what = f"VM {spec.name!r} (id {vm['id']})"
        try:
            delete_vm_and_wait(api, vm["id"], what, spec.delete_timeout_seconds, spec.poll_interval_seconds)
        except Exception as err:  # noqa: BLE001 - the report must carry both failures
            return (f"deleting it ALSO FAILED ({err}): {what} may still be billing; delete it in the console, or "
                    f"run `pulumi up` again, which adopts a VM named {spec.name!r} with labels {list(spec.labels)}")
        return f"{what} was deleted, nothing is left billing"

    def read(self, id_: str, props: dict[str, Any]) -> ReadResult:
        with client() as api:
            try:
                vm = api.get_vm(_int(id_))
            except HyperstackError as err:
                if err.not_found:
                    return ReadResult("", {})
                raise
        if vm.get("status") in _GONE:
            return ReadResult("", {})
        live = dict(props)
        live.update({"name": vm.get("name"), "labels": list(vm.get("labels") or []),
                     "flavor_name": (vm.get("flavor") or {}).get("name"),
                     "image_name": (vm.get("image") or {}).get("name"),
                     "key_name": (vm.get("keypair") or {}).get("name"),
                     "environment_name": (vm.get("environment") or {}).get("name"),
                     "region": (vm.get("environment") or {}).get("region") or props.get("region")})
        # Inputs are left as they are: the engine keeps user_data (secret) there, and a drifted label shows up
        # in the outputs, so the next diff restores it.
        return ReadResult(id_, _vm_outs(VmSpec.from_props(live), vm, _user_data_digest(props)))

    def update(self, id_: str, olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        spec = VmSpec.from_props(news)
        with client() as api:
            if list(olds.get("labels") or []) != list(spec.labels):
                api.set_vm_labels(_int(id_), spec.labels)
            vm = api.get_vm(_int(id_))
        return UpdateResult(_vm_outs(spec, vm, _user_data_digest(news)))

    def delete(self, id_: str, props: dict[str, Any]) -> None:
        timings = _timings(VmSpec, props)
        with client() as api:
            delete_vm_and_wait(api, _int(id_), f"VM {props.get('name', id_)!r} (id {id_})",
                               timings["delete_timeout_seconds"], timings["poll_interval_seconds"])


# --- SecurityRule -------------------------------------------------------------------------------------------------

_RULE_TEXT_INPUTS = ("direction", "protocol", "ethertype", "remote_ip_prefix")
_RULE_PORT_INPUTS = ("port_range_min", "port_range_max")
_RULE_INPUTS = ("vm_id", *_RULE_TEXT_INPUTS, *_RULE_PORT_INPUTS)


def _rule_key(rule: Mapping[str, Any]) -> tuple[Any, ...]:
    """What identifies a rule on its VM: every input but the VM, ports as numbers."""
    return (*(rule.get(k) for k in _RULE_TEXT_INPUTS), *(_opt_int(rule.get(k)) for k in _RULE_PORT_INPUTS))


class SecurityRuleProvider(_Provider):
    """One firewall rule on one VM. Every change replaces the rule; the VM is never touched."""

    def check(self, _olds: dict[str, Any], news: dict[str, Any]) -> CheckResult:
        failures = _name_failures(news, "vm_id", "direction", "protocol", "ethertype", "remote_ip_prefix")
        get = news.get
        if _known(get("direction")) and get("direction") not in ("ingress", "egress"):
            failures.append(CheckFailure("direction", "direction must be 'ingress' or 'egress'"))
        if _known(get("ethertype")) and get("ethertype") not in ("IPv4", "IPv6"):
            failures.append(CheckFailure("ethertype", "ethertype must be 'IPv4' or 'IPv6'"))
        if _known(get("protocol")) and get("protocol") not in PROTOCOLS:
            failures.append(CheckFailure("protocol", f"protocol must be one of {', '.join(sorted(PROTOCOLS))}"))
        prefix = get("remote_ip_prefix")
        if _known(prefix) and isinstance(prefix, str):
            try:
                net = ipaddress.ip_network(prefix, strict=False)
                if _known(get("ethertype")) and (net.version == 4) != (get("ethertype") == "IPv4"):
                    failures.append(CheckFailure("remote_ip_prefix", f"{prefix} does not match {get('ethertype')}"))
            except ValueError:
                failures.append(CheckFailure("remote_ip_prefix", f"{prefix!r} is not a CIDR like 203.0.113.7/32"))
        low, high = get("port_range_min"), get("port_range_max")
        for key, value in zip(_RULE_PORT_INPUTS, (low, high), strict=True):
            if _known(value) and not (isinstance(value, (int, float)) and 1 <= value <= 65535):
                failures.append(CheckFailure(key, f"{key} must be a port between 1 and 65535"))
        if isinstance(low, (int, float)) and isinstance(high, (int, float)) and low > high:
            failures.append(CheckFailure("port_range_min", "port_range_min is greater than port_range_max"))
        return CheckResult(news, failures)

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        changed = [k for k in _RULE_INPUTS if _rule_value(olds, k) != _rule_value(news, k)]
        # Create-before-delete: the new rule is in place before the old one goes, so access never lapses.
        return DiffResult(changes=bool(changed), replaces=changed, delete_before_replace=False)

    def create(self, props: dict[str, Any]) -> CreateResult:
        _require_valid(self, props)
        vm_id = _int(props["vm_id"])
        wanted = _rule_key(props)
        with client() as api:
            rule = self._find(api, vm_id, wanted)
            if rule is None:
                try:
                    rule = api.add_vm_security_rule(
                        vm_id, direction=props["direction"], protocol=props["protocol"],
                        ethertype=props["ethertype"], remote_ip_prefix=props["remote_ip_prefix"],
                        port_range_min=_opt_int(props.get("port_range_min")),
                        port_range_max=_opt_int(props.get("port_range_max")))
                except HyperstackError as err:
                    if not (_transient(err) or err.status == 409):
                        raise
                    rule = self._find(api, vm_id, wanted)
                    if rule is None:
                        raise
        return CreateResult(str(rule["id"]), {**_rule_inputs(props), "rule_id": str(rule["id"])})

    @staticmethod
    def _find(api: HyperstackClient, vm_id: int, wanted: tuple[Any, ...]) -> SecurityRuleRecord | None:
        rules = api.get_vm(vm_id).get("security_rules") or []
        return next((r for r in rules if _rule_key(r) == wanted), None)

    def read(self, id_: str, props: dict[str, Any]) -> ReadResult:
        # No GET for a single rule: read the VM and look for the id among its rules.
        with client() as api:
            try:
                vm = api.get_vm(_int(props["vm_id"]))
            except HyperstackError as err:
                if err.not_found:
                    return ReadResult("", {})
                raise
        rule = next((r for r in vm.get("security_rules") or [] if str(r.get("id")) == id_), None)
        if rule is None or vm.get("status") in _GONE:
            return ReadResult("", {})
        live = _rule_inputs({**rule, "vm_id": props["vm_id"]})
        return ReadResult(id_, {**live, "rule_id": id_}, live)

    def delete(self, id_: str, props: dict[str, Any]) -> None:
        with client() as api:
            try:
                api.delete_vm_security_rule(_int(props["vm_id"]), _int(id_))
            except HyperstackError as err:
                if not err.not_found:  # the rule, or its whole VM, is already gone
                    raise


def _rule_inputs(props: Mapping[str, Any]) -> dict[str, Any]:
    return {"vm_id": str(_int(props["vm_id"])), **{k: props.get(k) for k in _RULE_TEXT_INPUTS},
            **{k: _opt_int(props.get(k)) for k in _RULE_PORT_INPUTS}}


def _opt_int(value: Any) -> int | None:
    return None if value is None else _int(value)


def _rule_value(props: Mapping[str, Any], key: str) -> Any:
    value = props.get(key)
    if key in ("vm_id", *_RULE_PORT_INPUTS) and _known(value):
        return _int(value)
    return value
