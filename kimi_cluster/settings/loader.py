"""The one place raw config becomes Settings, or one SettingsError: stack files, Pulumi's config, the secrets' shapes.

`read_stack_file` reads a Pulumi.<stack>.yaml (bounded: no alias bomb gets through), `settings_from_pulumi` reads the
running program's config, and both end in `load_settings`, which validates the model, then the rules that need a
whole model (the engine flags kimi_cluster/plan/launch.py owns) and the secrets' shapes.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import ValidationError

from kimi_cluster.hyperstack_api.api import RETRY_BASE_CONFIG, RETRY_BASE_ENV, retry_base_problem
from kimi_cluster.settings import caretaker_rules, tls_check
from kimi_cluster.settings.errors import SettingsError, format_errors, how_to_set
from kimi_cluster.settings.kernel_cache_store import KernelCacheSettings
from kimi_cluster.settings.keys import CREDENTIAL_KEYS, NAMESPACE, SECRET_KEYS
from kimi_cluster.settings.model import Settings
from kimi_cluster.settings.namespaces import foreign_key_problems
from kimi_cluster.settings.rules import credentials_problem
from kimi_cluster.settings.ssh_key import private_key_problem


def config_keys() -> list[str]:
    """Every key a user may set under kimi-cluster:, secrets included."""
    keys = [f.alias or name for name, f in Settings.model_fields.items()
            if name not in ("stack", "hf_token_set", "ssh_private_key_set", "kernel_cache_credentials_set",
                            "tls_private_key_set", "plain_credentials", "caretaker_api_key_set")]
    return keys + list(SECRET_KEYS)



def _errors(err: ValidationError | None, extra: list[str]) -> str:
    return format_errors(err, extra, model=Settings, nested={"kernelCache": KernelCacheSettings}, known=config_keys())


def refusal(problems: list[str]) -> str:
    """A SettingsError's text for problems found once the model is whole, in the shape of the model's own."""
    return _errors(None, problems)


def load_settings(raw: Mapping[str, Any], stack: str, plain_credentials: Iterable[str] = ()) -> Settings:
    """Validate raw config (keys without namespace). Secret keys count only as set or not set.

    A secret given as text (inside the program) is inspected for its shape, then dropped: it never enters the model.
    """
    secret_problems = []
    key_text = raw.get("sshPrivateKey")
    if isinstance(key_text, str) and key_text:
        problem = private_key_problem(key_text)
        if problem:
            secret_problems.append(f"{NAMESPACE}:sshPrivateKey {problem}")
    credentials = raw.get("kernelCacheCredentials")
    if isinstance(credentials, str) and credentials and raw.get("kernelCache") is not None:
        problem = credentials_problem(credentials)
        if problem:
            secret_problems.append(f"{NAMESPACE}:kernelCacheCredentials {problem}")
    caretaker_key = raw.get("caretakerApiKey")
    encrypted = isinstance(caretaker_key, dict) and set(caretaker_key) == {"secure"}  # a stack file's ciphertext
    if caretaker_key not in (None, "", True) and not encrypted:  # True: set, its text not read here
        problem = caretaker_rules.key_problem(caretaker_key)
        if problem:
            secret_problems.append(f"{NAMESPACE}:caretakerApiKey {problem}")
    values: dict[str, Any] = {}
    internal = {name for name, f in Settings.model_fields.items() if f.alias and f.alias != name} | \
        {"stack", "hf_token_set", "ssh_private_key_set", "kernel_cache_credentials_set", "tls_private_key_set",
         "plain_credentials", "caretaker_api_key_set"}
    for key, value in raw.items():
        if key in SECRET_KEYS:
            continue
        if key in internal:  # a field's Python name is not a config key (populate_by_name would accept it)
            key = f"{key} (not a config key)"
        values[key] = value
    values["stack"] = stack
    values["hf_token_set"] = bool(raw.get("hfToken"))
    values["ssh_private_key_set"] = bool(raw.get("sshPrivateKey"))
    values["kernel_cache_credentials_set"] = bool(raw.get("kernelCacheCredentials"))
    values["tls_private_key_set"] = bool(raw.get("tlsPrivateKey"))
    values["plain_credentials"] = tuple(plain_credentials)
    values["caretaker_api_key_set"] = bool(raw.get("caretakerApiKey"))
    try:
        settings = Settings.model_validate(values)
    except ValidationError as err:
        raise SettingsError(_errors(err, secret_problems)) from None
    # The engine flags the program owns are known only from the command line the plan builds: they are checked
    # there, once this model is whole (kimi_cluster/plan/admission.py), before anything bills.
    tls_key = raw.get("tlsPrivateKey")
    if settings.tls_certificate is not None and isinstance(tls_key, str) and tls_key:
        problem = tls_check.key_problem(settings.tls_certificate, tls_key)
        if problem:
            secret_problems.append(f"{NAMESPACE}:tlsPrivateKey {problem}")
    if secret_problems:
        raise SettingsError(_errors(None, secret_problems))
    return settings


def strip_namespace(config: Mapping[str, Any]) -> dict[str, Any]:
    """`kimi-cluster:operatorCidr` -> `operatorCidr`; keys of other namespaces are dropped."""
    prefix = NAMESPACE + ":"
    return {k[len(prefix):]: v for k, v in config.items() if k.startswith(prefix)}


# Documentation ranges (RFC 5737, RFC 3849): a placeholder, never a real operator's address.
_DOC_NETS = [ipaddress.ip_network(n) for n in ("192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24", "2001:db8::/32")]


def _within(net: ipaddress.IPv4Network | ipaddress.IPv6Network,
            doc: ipaddress.IPv4Network | ipaddress.IPv6Network) -> bool:
    """Whether `net` lies in `doc`; typeshed types subnet_of per address family, so each family is tested apart."""
    if isinstance(net, ipaddress.IPv4Network) and isinstance(doc, ipaddress.IPv4Network):
        return net.subnet_of(doc)
    if isinstance(net, ipaddress.IPv6Network) and isinstance(doc, ipaddress.IPv6Network):
        return net.subnet_of(doc)
    return False


def placeholders(settings: Settings) -> list[str]:
    """Values still at the shipped placeholders; `pulumi up` refuses them, the offline plan only warns."""
    out = []
    net = ipaddress.ip_network(settings.operator_cidr)
    if any(_within(net, d) for d in _DOC_NETS):
        out.append(f"{NAMESPACE}:operatorCidr {settings.operator_cidr} is a documentation range (the shipped "
                   f"placeholder): set your own public address, e.g. pulumi config set {NAMESPACE}:operatorCidr "
                   f"\"$(curl -4 -s https://ifconfig.me)/32\"")
    if settings.ssh_public_key and "REPLACEWITHYOUROWN" in settings.ssh_public_key:
        out.append(f"{NAMESPACE}:sshPublicKey is the shipped placeholder; {how_to_set('sshPublicKey')}")
    return out


# A stack config is a few KB (its largest values a TLS chain and the SSH keys); the YAML parser is pure Python and
# takes minutes over tens of MB, so the file is read only up to this and refused beyond it.
STACK_FILE_MAX_BYTES = 1024 * 1024


def read_stack_file(path: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Read a Pulumi.<stack>.yaml: (kimi-cluster keys without namespace, every other key as written).

    Encrypted `secure:` values stay opaque; they only count as set.
    """
    import yaml  # only the offline tools read stack files; the program gets config from the engine

    try:
        with open(path, "rb") as fh:
            data = fh.read(STACK_FILE_MAX_BYTES + 1)
        if len(data) > STACK_FILE_MAX_BYTES:
            raise SettingsError(f"{path} is larger than {STACK_FILE_MAX_BYTES // 1024 ** 2} MB, more than any stack "
                                "config (a few KB, a TLS chain included), or not a file; give Pulumi.<stack>.yaml")
        doc = _load_yaml_bounded(data.decode("utf-8"), path) or {}
    except IsADirectoryError:
        raise SettingsError(f"{path} is a directory, not a stack config file (Pulumi.<stack>.yaml)") from None
    except OSError as err:
        raise SettingsError(f"cannot read {path}: {err.strerror}") from None
    except UnicodeDecodeError:
        raise SettingsError(f"{path} is not UTF-8 text") from None
    except RecursionError:  # the YAML composer recurses once per level of nesting
        raise SettingsError(f"{path} nests deeper than any stack config (thousands of levels)") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(err, "problem", None) or "malformed YAML"
        raise SettingsError(f"{path} is not valid YAML{where}: {problem}") from None
    if not isinstance(doc, dict):
        raise SettingsError(f"{path}: expected a mapping with a 'config' key, got {type(doc).__name__}")
    config = doc.get("config") or {}
    if not isinstance(config, dict):
        raise SettingsError(f"{path}: 'config' must be a mapping")
    foreign = foreign_key_problems(config)
    if foreign:
        raise SettingsError(_errors(None, foreign))
    ours = strip_namespace(config)
    others = {k: v for k, v in config.items() if not k.startswith(NAMESPACE + ":")}
    return ours, others


# What a stack file may expand to through YAML aliases: a real one has a few dozen nodes and no alias at all; a
# "billion laughs" file of 1 KB expands to millions, and every copy then reaches validation and its error message.
YAML_MAX_NODES = 10_000


def _load_yaml_bounded(stream: Any, path: str) -> Any:
    """yaml.safe_load, refusing a document whose aliases expand it past YAML_MAX_NODES nodes (counted on the composed
    graph, before any Python object is built)."""
    import yaml

    loader = yaml.SafeLoader(stream)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        sizes: dict[int, int] = {}

        def expanded(n: yaml.Node) -> int:
            # The same node object is shared by every alias of its anchor: counted once per use, computed once.
            if id(n) not in sizes:
                sizes[id(n)] = 0  # a recursive alias (a list holding itself) counts as one node
                children = [c for pair in n.value for c in pair] if isinstance(n, yaml.MappingNode) else \
                    list(n.value) if isinstance(n, yaml.SequenceNode) else []
                total = 1
                for child in children:
                    total += expanded(child)
                    if total > YAML_MAX_NODES:
                        break
                sizes[id(n)] = total
            return sizes[id(n)]

        if expanded(node) > YAML_MAX_NODES:
            raise SettingsError(f"{path} expands to more than {YAML_MAX_NODES:,} YAML nodes through its aliases "
                                "(&anchor / *alias); write the values out instead")
        return loader.construct_document(node)
    finally:
        loader.dispose()


def plain_credentials_in(config: Mapping[str, Any]) -> list[str]:
    """Credential keys of a stack file's config written as plain values instead of `secure:` ciphertext."""
    return [k for k in CREDENTIAL_KEYS if k in config and not isinstance(config[k], dict)]


def settings_from_pulumi() -> tuple[Settings, dict[str, Any]]:
    """Inside a Pulumi program: validate every kimi-cluster key; return settings and the secret Outputs."""
    import pulumi

    cfg = pulumi.Config(NAMESPACE)
    raw: dict[str, Any] = {}
    prefix = NAMESPACE + ":"
    full_keys = _stack_config_keys()
    # A misspelt namespace, and a backoff base (hyperstack:retryBaseSeconds or its variable) that would crash or
    # sleep for years on the first 429: both refused before the first resource is registered.
    foreign = foreign_key_problems({k: pulumi.runtime.get_config(k) if k == RETRY_BASE_CONFIG else None
                                    for k in full_keys})
    env_retry = os.environ.get(RETRY_BASE_ENV)
    if env_retry not in (None, "") and (problem := retry_base_problem(env_retry)):
        foreign.append(f"{RETRY_BASE_ENV} {problem}")
    if foreign:
        raise SettingsError(_errors(None, foreign))
    for full_key in full_keys:
        if full_key.startswith(prefix):
            key = full_key[len(prefix):]
            # Secrets are read through get_secret below; here only the shapes of the SSH key, the bucket credentials
            # and the TLS key are checked (the text is not kept), so an encrypted key, a public one, credentials
            # without their ':' or a TLS key that is not the certificate's are refused before anything is billed.
            if key in ("sshPrivateKey", "kernelCacheCredentials", "tlsPrivateKey", "caretakerApiKey"):
                raw[key] = pulumi.runtime.get_config(full_key) or True
            else:
                raw[key] = True if key in SECRET_KEYS else cfg.get(key)
    secrets = {key: cfg.get_secret(key) for key in SECRET_KEYS}
    plain = [k for k in CREDENTIAL_KEYS
             if pulumi.runtime.get_config(k) not in (None, "") and not pulumi.runtime.is_config_secret(k)]
    return load_settings(raw, pulumi.get_stack(), plain), secrets


def _stack_config_keys() -> list[str]:
    """Every key set in the stack's config, namespaced ("kimi-cluster:region").

    pulumi.Config reads one key by name, and the SDK exports no way to list them; but a misspelt key must be
    refused, not silently ignored. The SDK holds the whole config in `pulumi.runtime.config.CONFIG`, a ContextVar
    the language host fills before the program runs, which `pulumi.runtime` does not export. This is the one place
    that reads it, so an SDK change breaks here alone.
    """
    from pulumi.runtime import config as runtime_config

    return list(runtime_config.CONFIG.get().keys())
