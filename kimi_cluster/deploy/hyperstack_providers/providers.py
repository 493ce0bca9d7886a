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
of an existing stack unpickles it from there. Every path a stack recorded stays importable as an alias of this module:
`kimi_cluster.deploy.hyperstack.providers` (0.2.0 to 0.3.1, kimi_cluster/deploy/hyperstack/) and
`components.hyperstack.providers` (0.1.0, components/); a `*Provider` class keeps its name. The pickle of a provider
names its class and nothing else (serialize one with
`pulumi.dynamic.dynamic.serialize_provider` and list the globals in it with `pickletools.genops`), so the helpers the
classes call live in sibling modules, one concept each: `failures`, `inputs`, `polling`, `specs`, `vm_lifecycle`,
`vm_create`, `rule_inputs`; unpickling imports this module, which imports them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

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

from kimi_cluster.deploy.hyperstack_providers import drift_detection, progress, vm_create
from kimi_cluster.deploy.hyperstack_providers.failures import ProvisioningError, transient
from kimi_cluster.deploy.hyperstack_providers.inputs import (
    as_int,
    diff_inputs,
    known,
    name_failures,
    require_valid,
    timing_inputs,
)
from kimi_cluster.deploy.hyperstack_providers.polling import Look, poll, unanswered
from kimi_cluster.deploy.hyperstack_providers.rule_inputs import (
    RULE_INPUTS,
    opt_int,
    rule_failures,
    rule_inputs,
    rule_key,
    rule_value,
)
from kimi_cluster.deploy.hyperstack_providers.specs import (
    ENV_INPUTS,
    VM_REPLACE,
    VM_UPDATE,
    EnvironmentSpec,
    VmSpec,
    user_data_digest,
    vm_outs,
)
from kimi_cluster.deploy.hyperstack_providers.vm_lifecycle import GONE, delete_vm_and_wait, wait_active
from kimi_cluster.hyperstack_api.api import (
    API_KEY_CONFIG,
    API_URL_CONFIG,
    RETRY_BASE_CONFIG,
    ApiSettings,
    HyperstackClient,
    HyperstackError,
)
from kimi_cluster.hyperstack_api.records import EnvironmentRecord, KeypairRecord, SecurityRuleRecord

# Stack config handed to configure() by the dynamic provider host. Module state of the host process, never an
# attribute of a provider object: provider objects are pickled into the Pulumi state.
_HOST_CONFIG: dict[str, Any] = {}
_CONFIG_KEYS = (API_URL_CONFIG, API_KEY_CONFIG, RETRY_BASE_CONFIG)


def stack_config() -> dict[str, Any]:
    """The hyperstack:* values configure() received; ApiSettings.resolve falls back to the environment."""
    return {key: _HOST_CONFIG[key] for key in _CONFIG_KEYS if _HOST_CONFIG.get(key) is not None}


def client() -> HyperstackClient:
    return HyperstackClient.from_settings(ApiSettings.resolve(stack_config()), log=progress.info)


class HyperstackProvider(ResourceProvider):
    # The serialized provider (the `__provider` input and output of every resource of this type) is a secret only
    # when it captured a secret Output (pulumi/dynamic/dynamic.py, Resource.__init__: `serialize_as_secret_always or
    # contains_secrets`). This class holds nothing on self and its pickle names its module and class only (dill
    # pickles an importable class by reference), so there is nothing in it to hide; as a secret it only cost an
    # encryption per resource on every write of the state and a decryption on every read. Its own diff never reads
    # `__provider`, so a stack whose state holds the old, secret blob sees no change.
    serialize_as_secret_always = False

    def configure(self, req: ConfigureRequest) -> None:
        for key in _CONFIG_KEYS:
            value = req.config.get(key)
            if value is not None:
                _HOST_CONFIG[key] = value


# --- Environment --------------------------------------------------------------------------------------------------

class EnvironmentProvider(HyperstackProvider):
    """An environment: a named, region-bound container for keypairs and VMs."""

    def check(self, _olds: dict[str, Any], news: dict[str, Any]) -> CheckResult:
        return CheckResult(news, name_failures(news, "name", "region"))

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        # Names are unique across the organisation, so the old one must go before its successor is created.
        return diff_inputs(olds, news, ("name", "region"), ("delete_timeout_seconds", "poll_interval_seconds"), True)

    def create(self, props: dict[str, Any]) -> CreateResult:
        require_valid(self, props)
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
                    if not (transient(err) or err.status == 409):
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
        return {**{k: getattr(spec, k) for k in ENV_INPUTS}, "environment_id": str(env["id"]),
                "name": env.get("name", spec.name), "region": env.get("region", spec.region)}

    def read(self, id_: str, props: dict[str, Any]) -> ReadResult:
        with client() as api:
            try:
                env = api.get_environment(as_int(id_))
            except HyperstackError as err:
                if err.not_found:
                    return ReadResult("", {})
                raise
        spec = EnvironmentSpec.from_props({**props, "name": env["name"], "region": env["region"]})
        outs = self._outs(spec, env)
        return ReadResult(id_, outs, {k: outs[k] for k in ENV_INPUTS})

    def update(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        return UpdateResult({**olds, **{k: news[k] for k in ENV_INPUTS if k in news}})

    def delete(self, id_: str, props: dict[str, Any]) -> None:
        timings = timing_inputs(EnvironmentSpec, props)
        name = props.get("name", id_)
        with client() as api:
            def attempt() -> Look[bool]:
                try:
                    api.delete_environment(as_int(id_))
                except HyperstackError as err:
                    if err.not_found:
                        return Look("gone", True)
                    # 405 not_allowed: VMs or keypairs are still draining out of the environment.
                    if err.status == 405:
                        return Look("deletion refused (VMs or keypairs still in it)", None,
                                    "its VMs and keypairs to be gone", str(err))
                    if transient(err):
                        return unanswered(err, "the API to accept the deletion")
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


class KeypairProvider(HyperstackProvider):
    """Imports an OpenSSH public key into an environment. The public key is not a secret and lives in state."""

    def check(self, _olds: dict[str, Any], news: dict[str, Any]) -> CheckResult:
        failures = name_failures(news, "name", "environment_name", "public_key")
        key = news.get("public_key")
        if known(key) and isinstance(key, str) and "PRIVATE KEY" in key:
            # Refuse before it reaches the state file or the API.
            failures.append(CheckFailure("public_key", "this is a private key; pass the public (.pub) key"))
        elif known(key) and isinstance(key, str) and len(key.split()) < 2:
            failures.append(CheckFailure("public_key", "expected an OpenSSH public key: '<type> <base64> [comment]'"))
        return CheckResult(news, failures)

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        # The key's comment is not part of its identity (the API may not keep it): ignore it.
        olds = {**olds, "public_key": _key_body(str(olds.get("public_key") or ""))}
        news = {**news, "public_key": _key_body(str(news.get("public_key") or ""))}
        return diff_inputs(olds, news, _KEYPAIR_INPUTS, (), True)

    def create(self, props: dict[str, Any]) -> CreateResult:
        require_valid(self, props)
        name, env_name, public_key = (props[k] for k in _KEYPAIR_INPUTS)
        with client() as api:
            keypair = self._find(api, name, env_name, public_key)
            if keypair is None:
                try:
                    keypair = api.import_keypair(name, env_name, public_key)
                except HyperstackError as err:
                    if not (transient(err) or err.status == 409):
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
                api.delete_keypair(as_int(id_))
            except HyperstackError as err:
                if not err.not_found:
                    raise


# --- VirtualMachine -----------------------------------------------------------------------------------------------

class VirtualMachineProvider(HyperstackProvider):
    """One VM, created with a deterministic name and labels, adopted rather than duplicated, never left orphaned."""

    def check(self, _olds: dict[str, Any], news: dict[str, Any]) -> CheckResult:
        failures = name_failures(news, "name", "environment_name", "region", "flavor_name", "image_name",
                                  "key_name")
        labels = news.get("labels")
        if known(labels) and not (isinstance(labels, list) and all(isinstance(x, str) for x in labels)):
            failures.append(CheckFailure("labels", "labels must be a list of strings"))
        for key in ("create_timeout_seconds", "poll_interval_seconds", "delete_timeout_seconds"):
            value = news.get(key)
            if known(value) and not (isinstance(value, (int, float)) and value > 0):
                failures.append(CheckFailure(key, f"{key} must be a positive number of seconds"))
        return CheckResult(news, failures)

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        # The name is deterministic and adoption goes by name: the old VM must be gone before its replacement is
        # created, or the replacement would adopt the VM that is about to be deleted.
        olds = {**olds, "user_data": user_data_digest(olds)}
        news = {**news, "user_data": user_data_digest(news)}
        drifted = drift_detection.asked(lambda api: drift_detection.vm_drift(api, _id, olds), client)
        if drifted:
            # Changed behind Pulumi's back (a reclaim, a fault, a stop, a resize): `pulumi up` alone makes it again.
            reason, keys = drifted
            progress.warn(f"VM {news.get('name') or _id} (id {_id}) {reason}: it is REPLACED (deleted first, then "
                          "created again with its whole chain and its rules)")
            return DiffResult(changes=True, replaces=keys, delete_before_replace=True)
        return diff_inputs(olds, news, VM_REPLACE, VM_UPDATE, True)

    def create(self, props: dict[str, Any]) -> CreateResult:
        require_valid(self, props)
        spec = VmSpec.from_props(props)
        with client() as api:
            vm_create.preflight(api, spec)
            vm = vm_create.adopt(api, spec)
            if vm is None:
                vm = vm_create.post(api, spec)
            try:
                vm = wait_active(api, spec, vm)
            except Exception as exc:
                # Raising from create records nothing in state: a VM left behind here would bill untracked.
                raise ProvisioningError(f"{exc}; {vm_create.cleanup(api, spec, vm)}") from exc
        return CreateResult(str(vm["id"]), vm_outs(spec, vm, user_data_digest(props)))

    def read(self, id_: str, props: dict[str, Any]) -> ReadResult:
        with client() as api:
            try:
                vm = api.get_vm(as_int(id_))
            except HyperstackError as err:
                if err.not_found:
                    return ReadResult("", {})
                raise
        if vm.get("status") in GONE:
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
        return ReadResult(id_, vm_outs(VmSpec.from_props(live), vm, user_data_digest(props)))

    def update(self, id_: str, olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        spec = VmSpec.from_props(news)
        with client() as api:
            if list(olds.get("labels") or []) != list(spec.labels):
                api.set_vm_labels(as_int(id_), spec.labels)
            vm = api.get_vm(as_int(id_))
        return UpdateResult(vm_outs(spec, vm, user_data_digest(news)))

    def delete(self, id_: str, props: dict[str, Any]) -> None:
        timings = timing_inputs(VmSpec, props)
        drift_detection.forget(id_)
        with client() as api:
            delete_vm_and_wait(api, as_int(id_), f"VM {props.get('name', id_)!r} (id {id_})",
                               timings["delete_timeout_seconds"], timings["poll_interval_seconds"])


# --- SecurityRule -------------------------------------------------------------------------------------------------

class SecurityRuleProvider(HyperstackProvider):
    """One firewall rule on one VM. Every change replaces the rule; the VM is never touched."""

    def check(self, _olds: dict[str, Any], news: dict[str, Any]) -> CheckResult:
        return CheckResult(news, rule_failures(news))

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        changed = [k for k in RULE_INPUTS if rule_value(olds, k) != rule_value(news, k)]
        if not changed and drift_detection.asked(lambda api: drift_detection.rule_gone(api, _id, olds, news), client):
            port = opt_int(olds.get("port_range_min"))
            progress.warn(f"firewall rule {_id} ({olds.get('protocol')} port {port} from {olds.get('remote_ip_prefix')}"
                          f") is gone from VM {olds.get('vm_id')}: it is created again")
            changed = ["vm_id"]
        # Create-before-delete: the new rule is in place before the old one goes, so access never lapses.
        return DiffResult(changes=bool(changed), replaces=changed, delete_before_replace=False)

    def create(self, props: dict[str, Any]) -> CreateResult:
        require_valid(self, props)
        vm_id = as_int(props["vm_id"])
        wanted = rule_key(props)
        drift_detection.forget(vm_id)
        with client() as api:
            rule = self._find(api, vm_id, wanted)
            if rule is None:
                try:
                    rule = api.add_vm_security_rule(
                        vm_id, direction=props["direction"], protocol=props["protocol"],
                        ethertype=props["ethertype"], remote_ip_prefix=props["remote_ip_prefix"],
                        port_range_min=opt_int(props.get("port_range_min")),
                        port_range_max=opt_int(props.get("port_range_max")))
                except HyperstackError as err:
                    if not (transient(err) or err.status == 409):
                        raise
                    rule = self._find(api, vm_id, wanted)
                    if rule is None:
                        raise
        return CreateResult(str(rule["id"]), {**rule_inputs(props), "rule_id": str(rule["id"])})

    @staticmethod
    def _find(api: HyperstackClient, vm_id: int, wanted: tuple[Any, ...]) -> SecurityRuleRecord | None:
        rules = api.get_vm(vm_id).get("security_rules") or []
        return next((r for r in rules if rule_key(r) == wanted), None)

    def read(self, id_: str, props: dict[str, Any]) -> ReadResult:
        # No GET for a single rule: read the VM and look for the id among its rules.
        with client() as api:
            try:
                vm = api.get_vm(as_int(props["vm_id"]))
            except HyperstackError as err:
                if err.not_found:
                    return ReadResult("", {})
                raise
        rule = next((r for r in vm.get("security_rules") or [] if str(r.get("id")) == id_), None)
        if rule is None or vm.get("status") in GONE:
            return ReadResult("", {})
        live = rule_inputs({**rule, "vm_id": props["vm_id"]})
        return ReadResult(id_, {**live, "rule_id": id_}, live)

    def delete(self, id_: str, props: dict[str, Any]) -> None:
        with client() as api:
            drift_detection.forget(props["vm_id"])
            try:
                api.delete_vm_security_rule(as_int(props["vm_id"]), as_int(id_))
            except HyperstackError as err:
                if not err.not_found:  # the rule, or its whole VM, is already gone
                    raise
