"""The stack's configuration as one validated model: every key under `kimi-cluster:`, defaults per topology.

Validation runs before any resource is registered, so bad input costs nothing; every error names its key and
says how to set it. Secret values (hfToken, sshPrivateKey) never enter this model, only whether they are set.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import difflib
import ipaddress
import json
import math
import posixpath
import re
import reprlib
from collections.abc import Iterable, Mapping
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from components import catalog, sizing, tls_check

NAMESPACE = "kimi-cluster"
SECRET_KEYS = ("hfToken", "sshPrivateKey", "kernelCacheCredentials", "tlsPrivateKey")

# Every pattern is used with fullmatch: a `$` also matches before a trailing newline, which would let one through.
_HEX40 = re.compile(r"[0-9a-f]{40}")
_SSH_PUBLIC_KEY = re.compile(
    r"(ssh-ed25519|ssh-rsa|ecdsa-sha2-nistp(256|384|521)|sk-ssh-ed25519@openssh\.com) [A-Za-z0-9+/=]+"
    r"( [^\x00-\x1f\x7f]*)?")
# The widest IPv6 operatorCidr accepted: a /48 is one site's allocation.
IPV6_MIN_PREFIX = 48
# The widest IPv4 operatorCidr accepted (a /8 is the largest block ever allocated to one holder); wider than
# IPV4_WARN_PREFIX is accepted with a warning.
IPV4_MIN_PREFIX = 8
IPV4_WARN_PREFIX = 16
# Hyperstack's limit on environment, keypair and VM names (CreateEnvironment / CreateInstancesPayload).
NAME_MAX = 50
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,49}")
_REGION = re.compile(r"[A-Z0-9][A-Z0-9-]{0,39}")
_FLAVOR = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
# A GPU model and a per-VM count in a flavor name, as Hyperstack names them: n3-H100x8-NVLink, n3-B300-SXM6x8.
_FLAVOR_GPUS = re.compile(r"(?:^|-)(?P<gpu>[A-Z]\d{3})[A-Za-z0-9-]*?x(?P<count>\d+)(?:-|$)")
# Printable text: no control characters (a newline would start a new shell line in a log or a script).
_PRINTABLE = re.compile(r"[^\x00-\x1f\x7f]+")
_SERVED_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,127}")
# A login name as Debian's adduser accepts it (NAME_REGEX), at most 32 characters.
_SSH_USER = re.compile(r"[a-z_][a-z0-9_-]{0,31}")
# A container image reference: [registry[:port]/]path[:tag][@algorithm:hex] (distribution/reference's grammar), the
# digest of its algorithm's exact length (opencontainers/go-digest: sha256 is 64 lower-case hex): a shorter one is no
# digest, and would hide the "no digest" warning.
_IMAGE_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_IMAGE_DOMAIN = r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*(?::\d+)?/)"
_IMAGE = re.compile(rf"{_IMAGE_DOMAIN}?{_IMAGE_COMPONENT}(?:/{_IMAGE_COMPONENT})*(?::[\w][\w.-]{{0,127}})?"
                    r"(?:@(?:sha256:[0-9a-f]{64}|sha384:[0-9a-f]{96}|sha512:[0-9a-f]{128}))?")
# A DNS name of two or more labels (RFC 1123), lower case: it lands in URLs, client configs and the readiness wait.
_HOSTNAME = re.compile(r"(?:[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?\.)+[a-z](?:[a-z0-9-]{0,61}[a-z0-9])?")
# Paths the node scripts write into: plain characters only, so a path is one shell word whatever the quoting.
_PATH_CHARS = re.compile(r"[A-Za-z0-9._/-]+")
# storagePath may not be, or lie under, these: the scripts create, chown and fill it (Docker's data-root goes there).
_SYSTEM_TREES = ("/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/proc", "/run", "/sbin",
                 "/sys", "/usr")
_SYSTEM_DIRS = ("/", "/home", "/media", "/mnt", "/opt", "/root", "/snap", "/srv", "/tmp", "/var")
_HF_ENDPOINT = re.compile(r"(?P<scheme>https?)://(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?)"
                          r"(?::(?P<port>\d{1,5}))?(?P<path>/[A-Za-z0-9._~/-]*)?")
# The longest list a list key takes (extraEngineArgs, apiAllowedCidrs, regions): far beyond any real use, and short
# enough that each item's error stays cheap to build.
MAX_LIST_ITEMS = 256
# Ports the program itself uses on the nodes; the inference API may not take one of them.
SSH_PORT = 22
DIST_INIT_PORT = 20000  # SGLang's multi-node rendezvous (--dist-init-addr head:20000)
RESERVED_PORTS = {SSH_PORT: "SSH", DIST_INIT_PORT: "SGLang's multi-node rendezvous (--dist-init-addr)"}
# Secrets that must be set with --secret; a plain value sits unencrypted in Pulumi.<stack>.yaml and the state.
CREDENTIAL_KEYS = (f"{NAMESPACE}:hfToken", f"{NAMESPACE}:sshPrivateKey", f"{NAMESPACE}:kernelCacheCredentials",
                   f"{NAMESPACE}:tlsPrivateKey", "hyperstack:apiKey")


# Bounded repr: a value YAML aliases (or a huge JSON list) blew up is shown by its first few items, never built whole.
_REPR = reprlib.Repr()
_REPR.maxstring, _REPR.maxother, _REPR.maxlist, _REPR.maxdict, _REPR.maxlevel = 200, 60, 4, 4, 2


def _show(value: Any, limit: int = 60) -> str:
    """A value for an error message: repr (so control characters are visible), cut to `limit` characters."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return f"a {value.bit_length()}-bit integer"  # repr() refuses one of more than 4300 digits
    text = repr(value[:limit + 1]) if isinstance(value, str) else _REPR.repr(value)  # cut before it is copied
    return text if len(text) <= limit else text[:limit - 5] + "...'"


# Examples in error messages: the value a user would type to fix each key (`--secret` is added for SECRET_KEYS).
EXAMPLES: dict[str, str] = {
    "operatorCidr": "203.0.113.7/32",
    "topology": "h100x4-sglang",
    "modelRevision": catalog.KIMI_K31_PRO.default_revision,
    "sshPublicKey": '"$(cat ~/.ssh/kimi-deploy.pub)"',
    "sshPrivateKey": "< ~/.ssh/kimi-deploy",
    "hfToken": "hf_...",
    "region": "CANADA-1",
    "regions": '\'["CANADA-1", "NORWAY-1"]\'',
    "flavor": "n3-H100x8-NVLink",
    "nodeCount": "4",
    "gpusPerNode": "8",
    "gpuMemoryGb": "80",
    "engine": "sglang",
    "environmentName": "kimi-dev",
    "image": "lmsysorg/sglang:dev-kimi-k31-pro@sha256:...",
    "extraEngineArgs": '\'["--enable-metrics"]\'',
    "kernelCache": '\'{"backend": "s3", "bucket": "my-team-kimi-kernels", "region": "eu-central-1"}\'',
    "kernelCacheCredentials": "--secret ACCESS_KEY_ID:SECRET_ACCESS_KEY",
    "apiAllowedCidrs": '\'["203.0.113.7/32", "198.51.100.0/24"]\'',
    "apiKeyVersion": "2",
    "enginePort": "30000",
    "tlsCertificate": "< chain.pem",
    "tlsPrivateKey": "--secret < server.key",
    "proxyImage": "caddy:2.11.7-alpine@sha256:...",
    "apiHostname": "api.example.com",
    "apiInputPriceUsdPerM": "2.00",
    "apiOutputPriceUsdPerM": "10.00",
    "inputTokensPerOutputToken": "20",
    "engineLayout": "tp8-dcp8",
}
# A prefix wider than this (per IP version) lets in far more than one team's network: allowed, but warned about.
WIDE_PREFIX = {4: 16, 6: 48}
# The engines' multi-node rendezvous port (components/launch.py): the engine's own port must not collide with it.
_RESERVED_ENGINE_PORTS = (20000,)


class SettingsError(ValueError):
    """Invalid stack configuration; the message names each offending key and how to fix it."""


def _how_to_set(key: str) -> str:
    if "." in key:  # a field of an object setting
        return f"set it with: pulumi config set --path {NAMESPACE}:{key} {EXAMPLES.get(key, 'VALUE')}"
    secret = "--secret " if key in SECRET_KEYS else ""
    return f"set it with: pulumi config set {secret}{NAMESPACE}:{key} {EXAMPLES.get(key, 'VALUE')}"


# ---- durations: one rule for every key that makes one --------------------------------------------------------------
# Each node step's deadline becomes its custom_timeouts as a Go duration (components/node.py Timing.custom_timeout),
# and Go's time.ParseDuration stops near 2,562,047 hours (int64 nanoseconds): a longer one fails the registration
# after the VMs bill. A week is far inside that and longer than any step's real need (the weight download's default
# is 4 hours). Three seconds is the floor: below it `timeout` ends a step before its prelude has printed a line (the
# hung-step tests use 3 and 6 s deadlines on purpose); the whole-minute keys start at one minute anyway.
DURATION_MIN_MINUTES = 0.05
DURATION_MAX_MINUTES = 7 * 24 * 60
# What a kernel-cache step needs before its transfer starts: installing its S3 client (components/node.py
# PIP_BUDGET_S), the step's slack (Timing.deadline_slack_s), and a minute of transfer. A shorter step deadline would
# kill the step itself, failing `up`, where the transfer's own deadline only ever warns.
CACHE_STEP_MIN_MINUTES = (600 + 300 + 60) / 60
CACHE_STEPS = ("cache-restore", "cache-save")


def duration_problem(value: Any, low: float = DURATION_MIN_MINUTES, high: float = DURATION_MAX_MINUTES) -> str | None:
    """Why `value` cannot be a number of minutes in [low, high], or None; the one rule for every duration key."""
    number: Any = value
    if isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            return f"{_show(value)} is not a number of minutes"
    if isinstance(number, bool) or not isinstance(number, (int, float)):
        return f"{_show(value)} is not a number of minutes"
    if isinstance(number, float) and not math.isfinite(number):
        return f"{_show(value)} is not a finite number of minutes"
    if number <= 0:
        return f"{_show(value)} is not a positive number of minutes"
    if number < low:
        return f"{_show(value)} minutes is shorter than {low:g} minutes ({low * 60:g} s), which no step can meet"
    if number > high:
        return (f"{_show(value)} minutes is longer than {high:g} minutes ({high / 1440:g} days); Pulumi's custom "
                "timeouts and the node's `timeout` take nothing that long")
    return None


# ---- URLs the node scripts use: no credentials, no query; plain http only where no one else is on the path --------


def url_problem(v: str, secret_key: str) -> str | None:
    """Why `v` cannot be a hub or store URL rendered into node scripts (plain state), or None."""
    head = v.split("://", 1)[-1].split("/", 1)[0]
    if "@" in head:
        # Anything in the URL is rendered into the node scripts and stored in the state in plain text.
        return ("holds credentials (user:password@); they would be written into every node script and the state: "
                f"give them as a secret instead: pulumi config set --secret {NAMESPACE}:{secret_key} ...")
    match = _HF_ENDPOINT.fullmatch(v)
    if not match or int(match["port"] or 1) not in range(1, 65536):
        return (f"{_show(v)} is not a URL such as https://huggingface.co (scheme, host, optional port and path; no "
                "query, no spaces)")
    return None


def _on_private_path(host: str) -> bool:
    """The node's own loopback, or an address of a private network: no stranger between the node and it."""
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False  # a name may resolve to anywhere
    return any(address.version == n.version and address in n for n in _PRIVATE_PATHS)


# Loopback and the private networks of RFC 1918, RFC 4193 and RFC 6598 (documentation ranges are not among them: they
# stand for public hosts in examples).
_PRIVATE_PATHS = [ipaddress.ip_network(n) for n in ("127.0.0.0/8", "::1/128", "10.0.0.0/8", "172.16.0.0/12",
                                                     "192.168.0.0/16", "fc00::/7", "100.64.0.0/10")]


# S3's bucket naming rules (AWS S3 User Guide, "General purpose bucket naming rules"): 3-63 characters of lower-case
# letters, digits, '.' and '-', beginning and ending with a letter or digit, no '..', not an IP address, and none of
# the prefixes and suffixes S3 reserves. A name outside them is refused by the store, and the cache silently off.
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_BUCKET_RESERVED_PREFIXES = ("xn--", "sthree-", "amzn-s3-demo-")
_BUCKET_RESERVED_SUFFIXES = ("-s3alias", "--ol-s3", ".mrap", "--x-s3", "--table-s3")


def credentials_problem(text: str) -> str | None:
    """Why `text` cannot be kernelCacheCredentials (ACCESS_KEY_ID:SECRET_ACCESS_KEY), or None. Never quotes it."""
    key_id, sep, secret = text.strip().partition(":")
    if not sep or not key_id or not secret:
        return ("is not ACCESS_KEY_ID:SECRET_ACCESS_KEY (a ':' between two non-empty halves; the value is not shown): "
                "the nodes could not use it and every bring-up would start with a cold kernel cache")
    if not re.fullmatch(r"[!-~]+", key_id + secret):
        return ("holds spaces or control characters (the value is not shown); set exactly "
                "ACCESS_KEY_ID:SECRET_ACCESS_KEY")
    return None


_PREFIX = re.compile(r"^[A-Za-z0-9._/-]*$")
_S3_REGION = re.compile(r"^[a-z0-9][a-z0-9-]{0,40}$")


class KernelCacheSettings(BaseModel):
    """Where the engine's compiled kernels are kept between bring-ups: an S3-compatible bucket the team owns.

    AWS S3, Cloudflare R2, Backblaze B2, MinIO and other S3 APIs all take the same client with another endpointUrl.
    The credentials are a secret of their own (kernelCacheCredentials) and reach the nodes on stdin only.
    """

    model_config = ConfigDict(populate_by_name=True, extra="forbid", frozen=True)

    backend: Literal["s3"] = "s3"
    bucket: str
    prefix: str = "kimi-cluster/kernel-cache/"
    endpoint_url: str | None = Field(None, alias="endpointUrl")
    region: str = "us-east-1"
    addressing_style: Literal["auto", "path", "virtual"] = Field("auto", alias="addressingStyle")
    restore_timeout_minutes: int = Field(20, alias="restoreTimeoutMinutes", ge=1,
                                         le=DURATION_MAX_MINUTES)
    save_timeout_minutes: int = Field(30, alias="saveTimeoutMinutes", ge=1,
                                      le=DURATION_MAX_MINUTES)

    @field_validator("bucket")
    @classmethod
    def _bucket(cls, v: str) -> str:
        if not _BUCKET.fullmatch(v) or any(p in v for p in ("..", ".-", "-.")):
            raise ValueError(f"{_show(v)} is not an S3 bucket name (3-63 lowercase letters, digits, '.' or '-', "
                             "beginning and ending with a letter or digit)")
        if re.fullmatch(r"\d+\.\d+\.\d+\.\d+", v) or v.startswith(_BUCKET_RESERVED_PREFIXES) \
                or v.endswith(_BUCKET_RESERVED_SUFFIXES):
            raise ValueError(f"{_show(v)} is an IP address or uses a prefix or suffix S3 reserves (xn--, sthree-, "
                             "-s3alias, --ol-s3, ...): no S3 store accepts it as a bucket name")
        return v

    @field_validator("endpoint_url")
    @classmethod
    def _endpoint_url(cls, v: str | None) -> str | None:
        if v is None:
            return v
        problem = url_problem(v, "kernelCacheCredentials")
        if problem:
            raise ValueError(problem)
        match = _HF_ENDPOINT.fullmatch(v)
        if match and match["scheme"] == "http" and not _on_private_path(match["host"]):
            # The archive holds compiled kernels the engine runs, and the manifest that vouches for it: over plain
            # http, anyone on the path can swap both.
            raise ValueError(f"{_show(v)} is plain http:// to a host outside loopback and private networks: anyone on "
                             "the path could swap the kernel archive (code the engine runs); use https://")
        return v.rstrip("/")

    @field_validator("restore_timeout_minutes", "save_timeout_minutes", mode="before")
    @classmethod
    def _transfer_minutes(cls, v: Any) -> Any:
        problem = duration_problem(v)
        if problem:
            raise ValueError(problem)
        return v

    @field_validator("prefix")
    @classmethod
    def _prefix(cls, v: str) -> str:
        if not _PREFIX.match(v) or ".." in v.split("/"):
            raise ValueError(f"{_show(v)} is not a plain key prefix (letters, digits, '.', '_', '-', '/')")
        v = v.strip("/")
        return v + "/" if v else ""

    @field_validator("region")
    @classmethod
    def _region(cls, v: str) -> str:
        if not _S3_REGION.match(v):
            raise ValueError(f"{_show(v)} is not a region name such as eu-central-1 or auto")
        return v

    @property
    def location(self) -> str:
        where = f" at {self.endpoint_url}" if self.endpoint_url else ""
        return f"s3://{self.bucket}/{self.prefix}{where}"


T = TypeVar("T")


def _custom(value: T | None, key: str) -> T:
    """A custom topology's own value: Settings refuses a custom topology without it, so None here is a bug."""
    if value is None:
        raise SettingsError(f"{NAMESPACE}:{key} is required for topology custom")
    return value


class Settings(BaseModel):
    """Validated stack settings. Field aliases are the camelCase config keys."""

    model_config = ConfigDict(populate_by_name=True, extra="forbid", frozen=True)

    stack: str
    topology: Literal["h100x4-sglang", "b300x1-vllm", "b300x1-tokenspeed", "custom"] = catalog.DEFAULT_TOPOLOGY
    # custom topology only
    flavor: str | None = None
    node_count: int | None = Field(None, alias="nodeCount", ge=1, le=20)
    gpus_per_node: int | None = Field(None, alias="gpusPerNode", ge=1, le=16)
    gpu_memory_gb: int | None = Field(None, alias="gpuMemoryGb")
    engine: Literal["sglang", "vllm", "tokenspeed"] | None = None
    gpu_hourly_price_usd: float | None = Field(None, alias="gpuHourlyPriceUsd", gt=0, le=1000, allow_inf_nan=False)

    region: str = catalog.DEFAULT_REGION
    # Ordered preference; the placement resource picks the first with stock for the whole cluster, once.
    regions: list[str] | None = None
    environment_name: str | None = Field(None, alias="environmentName")
    operator_cidr: str = Field(alias="operatorCidr")
    # The operator reaches the VMs over a private network or loopback (a VPN into the cloud, the local sandbox).
    allow_private_operator_cidr: bool = Field(False, alias="allowPrivateOperatorCidr")
    ssh_public_key: str | None = Field(None, alias="sshPublicKey")
    keypair_name: str | None = Field(None, alias="keypairName")
    ssh_user: str = Field("ubuntu", alias="sshUser")

    model: str = catalog.KIMI_K31_PRO.repo
    model_revision: str = Field(catalog.KIMI_K31_PRO.default_revision, alias="modelRevision")
    served_model_name: str | None = Field(None, alias="servedModelName")
    image: str | None = None
    os_image: str | None = Field(None, alias="osImage")
    api_port: int = Field(8000, alias="apiPort", ge=1, le=65535)
    # Who may reach the API port (the TLS proxy on the head); default: operatorCidr only. SSH stays operatorCidr.
    api_allowed_cidrs: list[str] | None = Field(None, alias="apiAllowedCidrs")
    # Bumping it makes a new API key; the engine keeps running, only the proxy's key file changes.
    api_key_version: int = Field(1, alias="apiKeyVersion", ge=1, le=1_000_000)
    # The engine listens on the head's loopback only, on this port; the proxy forwards to it.
    engine_port: int = Field(30000, alias="enginePort", ge=1, le=65535)
    # Bring your own server certificate (PEM chain, leaf first, ending with the CA clients should trust); its key
    # is the secret tlsPrivateKey. Unset: the stack makes its own CA and a certificate for the head's address.
    tls_certificate: str | None = Field(None, alias="tlsCertificate")
    # The DNS name clients use for the API (you keep its record pointing at the head): the URLs, the client configs and
    # the readiness wait's TLS check use it; your own tlsCertificate must name it. Unset: the head's public IP.
    api_hostname: str | None = Field(None, alias="apiHostname")
    proxy_image: str | None = Field(None, alias="proxyImage")
    max_model_len: int | None = Field(None, alias="maxModelLen", ge=1024, le=2**24)
    context_window: int = Field(131072, alias="contextWindow", ge=1024, le=2**24)
    extra_engine_args: list[str] = Field(default_factory=list, alias="extraEngineArgs")
    # How vLLM places the model on its one node (catalog.VLLM_LAYOUTS); unset is tp8, today's layout.
    engine_layout: Literal["tp8", "dp8-ep", "tp8-dcp8"] | None = Field(None, alias="engineLayout")

    # node bring-up knobs
    node_root: str = Field("/", alias="nodeRoot")
    storage_path: str = Field("/ephemeral", alias="storagePath")
    # Bounded so the scripts' shell arithmetic (64-bit) never overflows: 1 PB of margin is far beyond any disk.
    disk_margin_gb: int = Field(100, alias="diskMarginGb", ge=0, le=10**6)
    download_workers: int = Field(16, alias="downloadWorkers", ge=1, le=128)
    download_timeout_minutes: int = Field(240, alias="downloadTimeoutMinutes", ge=1, le=7 * 24 * 60)
    readiness_timeout_minutes: int = Field(60, alias="readinessTimeoutMinutes", ge=1, le=24 * 60)
    # Per-step override of the node-side deadline (components.node.Timing.deadline_s), e.g. {"image": 120}.
    step_deadline_minutes: dict[str, float] = Field(default_factory=dict, alias="stepDeadlineMinutes")
    # Free since every file is hashed while it is written (scripts/fetch_weights.py): the check compares records.
    verify_sha256: bool = Field(True, alias="verifySha256")
    # Where each node serves its finished weight files to its peers (private addresses only).
    peer_port: int = Field(20100, alias="peerPort", ge=1024, le=65535)
    hf_endpoint: str = Field("https://huggingface.co", alias="hfEndpoint")
    kernel_cache: KernelCacheSettings | None = Field(None, alias="kernelCache")
    # Replicas behind one front (components/replicas.py, components/front.py): whole engine groups, each sized alone.
    replicas: int = Field(1, ge=1, le=catalog.MAX_REPLICAS)
    front_flavor: str = Field(catalog.FRONT_FLAVOR.name, alias="frontFlavor")
    front_os_image: str | None = Field(None, alias="frontOsImage")
    front_hourly_price_usd: float | None = Field(None, alias="frontHourlyPriceUsd", gt=0, le=1000,
                                                 allow_inf_nan=False)

    # The API the cluster is compared with (plan: break-even; status: cost per token). Defaults: catalog.py.
    api_input_price_usd_per_m: float | None = Field(None, alias="apiInputPriceUsdPerM", ge=0, le=10_000,
                                                    allow_inf_nan=False)
    api_output_price_usd_per_m: float | None = Field(None, alias="apiOutputPriceUsdPerM", gt=0, le=10_000,
                                                     allow_inf_nan=False)
    input_tokens_per_output_token: float | None = Field(None, alias="inputTokensPerOutputToken", ge=0, le=100_000,
                                                        allow_inf_nan=False)

    # secrets: presence only, the values stay in Pulumi's secret config
    hf_token_set: bool = False
    ssh_private_key_set: bool = False
    kernel_cache_credentials_set: bool = False
    tls_private_key_set: bool = False
    # credentials given as plain (unencrypted) config values: warned about
    plain_credentials: tuple[str, ...] = ()

    @field_validator("operator_cidr")
    @classmethod
    def _operator_cidr(cls, v: str) -> str:
        try:
            net = ipaddress.ip_network(str(v).strip(), strict=False)
        except ValueError:
            raise ValueError(f"{_show(v)} is not a CIDR such as 203.0.113.7/32") from None
        if net.prefixlen == 0:
            raise ValueError(
                f"{_show(v)} opens SSH and the API to the whole internet; use your own address, e.g. 203.0.113.7/32"
            )
        if net.version == 6 and net.prefixlen < IPV6_MIN_PREFIX:
            # A /48 is one site; anything wider spans many customers of an ISP (RFC 6177).
            raise ValueError(
                f"{_show(v)} is wider than one site (/{IPV6_MIN_PREFIX}) and opens SSH and the API to other networks; "
                f"use your own address (/128) or at most your site's /{IPV6_MIN_PREFIX}, e.g. "
                f"\"$(curl -4 -s https://ifconfig.me)/32\" for your IPv4 address"
            )
        if net.version == 4 and net.prefixlen < IPV4_MIN_PREFIX:
            raise ValueError(
                f"{_show(v)} opens SSH and the API to {2 ** (32 - net.prefixlen):,} addresses of other networks; "
                "use your own address, e.g. \"$(curl -4 -s https://ifconfig.me)/32\""
            )
        return str(net)

    @field_validator("api_allowed_cidrs", mode="before")
    @classmethod
    def _cidr_list(cls, v: Any) -> Any:
        if isinstance(v, str):
            text = v.strip()
            try:
                v = json.loads(text) if text.startswith("[") else [p for p in re.split(r"[,\s]+", text) if p]
            except (ValueError, RecursionError):  # RecursionError: nested past Python's stack
                raise ValueError('expected a JSON list of CIDRs, e.g. \'["203.0.113.7/32"]\'') from None
        if v is None:
            return v
        if isinstance(v, list) and len(v) > MAX_LIST_ITEMS:
            raise ValueError(f"{len(v):,} entries; at most {MAX_LIST_ITEMS} (one firewall rule each)")
        if not isinstance(v, list) or not v or not all(isinstance(c, str) for c in v):
            raise ValueError('expected a non-empty list of CIDRs, e.g. \'["203.0.113.7/32"]\'')
        out: list[str] = []
        for cidr in v:
            try:
                if "%" in cidr:  # an IPv6 zone id names an interface of this machine, not a network of the VM's
                    raise ValueError(cidr)
                net = ipaddress.ip_network(cidr.strip(), strict=False)
            except ValueError:
                raise ValueError(f"{_show(cidr)} is not a CIDR such as 203.0.113.7/32 or 198.51.100.0/24") from None
            if net.prefixlen == 0:
                raise ValueError(f"{_show(cidr)} opens the API to the whole internet; list the networks that need it")
            if str(net) not in out:
                out.append(str(net))
        return out

    @field_validator("tls_certificate")
    @classmethod
    def _certificate(cls, v: str | None) -> str | None:
        if v is None or not v.strip():
            return None
        if "PRIVATE KEY" in v:  # said before parsing, and never quoted: it is a secret pasted into a plain key
            raise ValueError("holds a private key (not shown): it goes in the secret tlsPrivateKey; set it with: "
                             f"pulumi config set --secret {NAMESPACE}:tlsPrivateKey < server.key")
        from cryptography import x509

        try:
            x509.load_pem_x509_certificates(v.strip().encode())
        except ValueError:
            raise ValueError("not a PEM certificate chain (expected -----BEGIN CERTIFICATE----- blocks, leaf "
                             "first, ending with the CA clients should trust)") from None
        return v.strip() + "\n"

    @field_validator("api_hostname")
    @classmethod
    def _api_hostname(cls, v: str | None) -> str | None:
        if v is None:
            return v
        if not _HOSTNAME.fullmatch(v) or len(v) > 253 or _is_ip(v):
            raise ValueError(f"{_show(v)} is not a DNS name such as api.example.com (lower-case letters, digits and "
                             "'-' in dot-separated labels; no scheme, port or trailing dot)")
        return v

    @field_validator("model_revision")
    @classmethod
    def _revision(cls, v: str) -> str:
        if not _HEX40.fullmatch(v):
            raise ValueError(
                f"{_show(v)} is not a 40-hex commit; a branch or tag can move, so the deployment would not be "
                "reproducible. Pin the commit shown on the model's hub page"
            )
        return v

    @field_validator("ssh_public_key")
    @classmethod
    def _public_key(cls, v: str | None) -> str | None:
        if v is not None and not _SSH_PUBLIC_KEY.fullmatch(v.strip()):
            raise ValueError("not an OpenSSH public key (expected e.g. 'ssh-ed25519 AAAA... comment')")
        return v.strip() if v else v

    @field_validator("environment_name", "keypair_name")
    @classmethod
    def _names(cls, v: str | None) -> str | None:
        if v is not None and not _NAME.fullmatch(v):
            raise ValueError("use 1-50 letters, digits, '-' or '_' (Hyperstack's limit is 50 characters)")
        return v

    @field_validator("flavor")
    @classmethod
    def _flavor(cls, v: str | None) -> str | None:
        if v is not None and not _FLAVOR.fullmatch(v):
            raise ValueError(f"{_show(v)} is not a flavor name such as n3-H100x8-NVLink")
        return v

    @field_validator("os_image")
    @classmethod
    def _os_image(cls, v: str | None) -> str | None:
        if v is not None and (not _PRINTABLE.fullmatch(v) or v != v.strip() or len(v) > 200):
            raise ValueError(f"{_show(v)} is not an image name as Hyperstack lists them (printable, no surrounding "
                             "spaces), e.g. 'Ubuntu Server 24.04 LTS R570 CUDA 12.8 with Docker'")
        return v

    @field_validator("served_model_name")
    @classmethod
    def _served_name(cls, v: str | None) -> str | None:
        if v is not None and not _SERVED_NAME.fullmatch(v):
            raise ValueError(f"{_show(v)}: use 1-128 letters, digits and . _ : / @ + - (it lands in clients' shell, "
                             "TOML and JSON)")
        return v

    @field_validator("image", "proxy_image")
    @classmethod
    def _image(cls, v: str | None) -> str | None:
        if v is not None and (len(v) > 512 or not _IMAGE.fullmatch(v)):
            raise ValueError(f"{_show(v)} is not a container image reference such as "
                             "registry.example.com/org/name:tag@sha256:<64 hex>")
        return v

    @field_validator("ssh_user")
    @classmethod
    def _ssh_user(cls, v: str) -> str:
        if not _SSH_USER.fullmatch(v):
            raise ValueError(f"{_show(v)} is not a login name: lower-case letters, digits, '_' and '-', "
                             "at most 32, e.g. ubuntu")
        return v

    @field_validator("api_port")
    @classmethod
    def _api_port(cls, v: int) -> int:
        if v in RESERVED_PORTS:
            raise ValueError(f"port {v} is taken by {RESERVED_PORTS[v]}; choose another, e.g. 8000")
        return v

    @field_validator("hf_endpoint")
    @classmethod
    def _hf_endpoint(cls, v: str) -> str:
        problem = url_problem(v, "hfToken")
        if problem:
            raise ValueError(problem)
        match = _HF_ENDPOINT.fullmatch(v)
        return v.rstrip("/") if match and match["path"] else v

    @field_validator("extra_engine_args", mode="before")
    @classmethod
    def _json_list(cls, v: Any) -> Any:
        # `pulumi config set` stores a list as a JSON string unless --path is used
        if isinstance(v, str):
            try:
                v = json.loads(v)
            except (ValueError, RecursionError):  # RecursionError: nested past Python's stack
                raise ValueError("expected a JSON list of strings, e.g. '[\"--enable-metrics\"]'") from None
        if isinstance(v, list) and len(v) > MAX_LIST_ITEMS:
            raise ValueError(f"{len(v):,} arguments; at most {MAX_LIST_ITEMS} are taken")
        return v

    @field_validator("regions", mode="before")
    @classmethod
    def _regions(cls, v: Any) -> Any:
        if isinstance(v, str):  # `pulumi config set` stores a list as a JSON string unless --path is used
            try:
                v = json.loads(v)
            except (ValueError, RecursionError):  # RecursionError: nested past Python's stack
                raise ValueError('expected a JSON list of region names, e.g. \'["CANADA-1", "NORWAY-1"]\'') from None
        if isinstance(v, list):
            if not v:
                raise ValueError("name at least one region")
            if len(v) > MAX_LIST_ITEMS:
                raise ValueError(f"{len(v):,} regions; at most {MAX_LIST_ITEMS}")
            if not all(isinstance(r, str) and _REGION.fullmatch(r) for r in v):
                raise ValueError("each region is a Hyperstack region name such as CANADA-1")
            if len(set(v)) != len(v):
                raise ValueError("a region is listed twice")
        return v

    @field_validator("region")
    @classmethod
    def _region(cls, v: str) -> str:
        if not _REGION.fullmatch(v):
            raise ValueError(f"{_show(v)} is not a Hyperstack region name such as CANADA-1")
        return v

    @field_validator("download_timeout_minutes", "readiness_timeout_minutes", mode="before")
    @classmethod
    def _timeouts(cls, v: Any) -> Any:
        problem = duration_problem(v)
        if problem:
            raise ValueError(problem)
        return v

    @field_validator("step_deadline_minutes", mode="before")
    @classmethod
    def _step_deadlines(cls, v: Any) -> Any:
        if isinstance(v, str):
            try:
                v = json.loads(v)
            except (ValueError, RecursionError):  # RecursionError: nested past Python's stack
                raise ValueError('expected a JSON object of step -> minutes, e.g. \'{"image": 120}\'') from None
        if not isinstance(v, dict):
            raise ValueError('expected a JSON object of step -> minutes, e.g. \'{"image": 120}\'')
        # Imported here: components.node imports this module, and its step list is the one that counts.
        from components.node import ALL_STEPS

        for step, minutes in v.items():
            if step not in ALL_STEPS:
                raise ValueError(f"{_show(step)} is not a node step; steps are {', '.join(ALL_STEPS)}")
            if isinstance(minutes, bool) or not isinstance(minutes, (int, float)):
                raise ValueError(f"{step}: {_show(minutes)} is not a positive number of minutes")
            problem = duration_problem(minutes)
            if problem is None and step in CACHE_STEPS and minutes < CACHE_STEP_MIN_MINUTES:
                problem = (f"{_show(minutes)} minutes is shorter than {CACHE_STEP_MIN_MINUTES:g}: {step} first "
                           "installs its S3 client, and its deadline must leave that, its slack and a minute of "
                           "transfer, or the step fails `up`")
            if problem:
                raise ValueError(f"{step}: {problem}")
        return v

    @field_validator("kernel_cache", mode="before")
    @classmethod
    def _json_object(cls, v: Any) -> Any:
        # `pulumi config set kimi-cluster:kernelCache '{...}'` stores a JSON string; `--path` stores an object
        if isinstance(v, str):
            try:
                v = json.loads(v)
            except (ValueError, RecursionError):  # RecursionError: nested past Python's stack
                raise ValueError('expected a JSON object, e.g. \'{"bucket": "my-team-kimi-kernels"}\'') from None
            if not isinstance(v, dict):
                raise ValueError('expected a JSON object, e.g. \'{"bucket": "my-team-kimi-kernels"}\'')
        return v

    @field_validator("extra_engine_args")
    @classmethod
    def _engine_args(cls, v: list[str]) -> list[str]:
        for arg in v:
            if not arg or len(arg) > 1000 or not _PRINTABLE.fullmatch(arg):
                raise ValueError(f"{_show(arg)}: each argument must be 1-1000 printable characters")
        return v

    @field_validator("node_root")
    @classmethod
    def _node_root(cls, v: str) -> str:
        # A relative root (a test root, the sandbox's ".") is resolved from the SSH login directory on the node.
        if not _PATH_CHARS.fullmatch(v) or posixpath.normpath(v) != v:
            raise ValueError(f"{_show(v)} must be / (a real VM) or a normalized path of letters, digits and . _ - /")
        return v

    @field_validator("storage_path")
    @classmethod
    def _storage_path(cls, v: str) -> str:
        if not _PATH_CHARS.fullmatch(v) or not v.startswith("/") or posixpath.normpath(v) != v \
                or ".." in v.split("/"):
            raise ValueError(f"{_show(v)} must be a normalized absolute path of letters, digits and . _ - /, "
                             "e.g. /ephemeral")
        if v in _SYSTEM_DIRS or any(v == t or v.startswith(t + "/") for t in _SYSTEM_TREES):
            raise ValueError(f"{v} is a system directory; the scripts fill it with weights and move Docker's data "
                             "there: use the VM's large local disk, e.g. /ephemeral")
        return v

    @model_validator(mode="after")
    def _shape(self) -> Settings:
        custom_keys = {"flavor": self.flavor, "nodeCount": self.node_count, "gpusPerNode": self.gpus_per_node,
                       "gpuMemoryGb": self.gpu_memory_gb, "engine": self.engine}
        if self.topology == "custom":
            missing = [k for k, v in custom_keys.items() if v is None]
            if missing:
                raise ValueError(f"{NAMESPACE}:topology custom needs "
                                 f"{', '.join(NAMESPACE + ':' + k for k in missing)} as well")
            if self.gpu_memory_gb not in catalog.GPU_BY_MEMORY_GB:
                known = ", ".join(str(k) for k in sorted(catalog.GPU_BY_MEMORY_GB))
                raise ValueError(
                    f"{NAMESPACE}:gpuMemoryGb {self.gpu_memory_gb} is not a known GPU size; known: {known}")
            if self.engine == "vllm" and self.node_count != 1:
                raise ValueError(f"{NAMESPACE}:engine vllm is supported on one node only ({NAMESPACE}:nodeCount 1); "
                                 "use sglang across nodes")
            mismatch = self._flavor_matches()  # before sizing: a wrong GPU count would size the wrong cluster
            if mismatch:
                raise ValueError(mismatch)
        else:
            given = [k for k, v in custom_keys.items() if v is not None]
            if given:
                raise ValueError(f"{', '.join(NAMESPACE + ':' + k for k in given)} only apply to topology custom "
                                 f"({NAMESPACE}:topology is {self.topology})")
        if self.regions is not None and "region" in self.model_fields_set:
            raise ValueError(f"set only one of {NAMESPACE}:region (one region) and {NAMESPACE}:regions (an ordered "
                             f"list); remove one with: pulumi config rm {NAMESPACE}:region")
        if self.peer_port in (self.api_port, self.engine_port, 20000):  # 20000: SGLang's rendezvous (launch.py)
            raise ValueError(f"{NAMESPACE}:peerPort {self.peer_port} collides with apiPort, enginePort or the "
                             f"rendezvous port 20000; pick another, e.g. {NAMESPACE}:peerPort 20100")
        if self.ssh_public_key is None and self.keypair_name is None:
            raise ValueError(f"set {NAMESPACE}:sshPublicKey (a keypair is imported) or {NAMESPACE}:keypairName (an "
                             "existing one is reused)")
        if self.ssh_public_key is not None and self.keypair_name is not None:
            raise ValueError(f"set only one of {NAMESPACE}:sshPublicKey and {NAMESPACE}:keypairName")
        if self.kernel_cache is not None and not self.kernel_cache_credentials_set:
            raise ValueError(
                f"{NAMESPACE}:kernelCacheCredentials is required with {NAMESPACE}:kernelCache (the bucket's access "
                f"key); set it with: pulumi config set --secret {NAMESPACE}:kernelCacheCredentials "
                "ACCESS_KEY_ID:SECRET_ACCESS_KEY")
        if self.engine_port in (self.api_port, SSH_PORT, *_RESERVED_ENGINE_PORTS):
            raise ValueError(f"{NAMESPACE}:enginePort {self.engine_port} collides with apiPort, SSH (22) or the "
                             f"rendezvous port 20000; pick another, e.g. {NAMESPACE}:enginePort 30000")
        if (self.tls_certificate is not None) != self.tls_private_key_set:
            raise ValueError(f"{NAMESPACE}:tlsCertificate and {NAMESPACE}:tlsPrivateKey go together: set both (your "
                             "own certificate) or neither (the stack makes its own CA)")
        if self.model not in catalog.MODELS:
            raise ValueError(f"{NAMESPACE}:model {_show(self.model)} has no sizing data; known: "
                             f"{', '.join(catalog.MODELS)}")
        fit = self.fit
        if not fit.fits:
            fitting = [t.name for t in catalog.TOPOLOGIES.values()
                       if sizing.check_fit(self.model_spec, catalog.GPUS[t.gpu], t.node_count, t.gpus_per_node,
                                           t.node_count * t.gpus_per_node).fits]
            raise ValueError(
                f"the cluster cannot serve {self.model}: {fit.summary()}. Change {NAMESPACE}:topology (presets that "
                f"fit: {', '.join(fitting)}) or, for topology custom, nodeCount, gpusPerNode and gpuMemoryGb"
            )
        return self

    @model_validator(mode="after")
    def _replica_rules(self) -> Settings:
        """replicas >= 2: the front's flavor and image are names the API sees, and every derived VM name fits."""
        if self.replicas == 1:
            return self
        problems = []
        if not _FLAVOR.fullmatch(self.front_flavor):
            problems.append(f"{NAMESPACE}:frontFlavor {_show(self.front_flavor)} is not a Hyperstack flavor name")
        elif self.front_flavor not in catalog.CPU_FLAVORS and self.front_hourly_price_usd is None:
            problems.append(f"{NAMESPACE}:frontFlavor {self.front_flavor} has no catalog price (known: "
                            f"{', '.join(catalog.CPU_FLAVORS)}); set {NAMESPACE}:frontHourlyPriceUsd for it")
        if self.front_os_image is not None and not _PRINTABLE.fullmatch(self.front_os_image):
            problems.append(f"{NAMESPACE}:frontOsImage {_show(self.front_os_image)} has control characters")
        if _NAME.fullmatch(self.env_name):
            longest = max((self.replica_node_name(self.replicas - 1, self.nodes - 1), self.front_name), key=len)
            if len(longest) > NAME_MAX:
                room = NAME_MAX - (len(longest) - len(self.env_name))
                problems.append(f"{NAMESPACE}:replicas {self.replicas} makes the VM name {longest!r} "
                                f"{len(longest)} characters; Hyperstack allows {NAME_MAX}: set "
                                f"{NAMESPACE}:environmentName to at most {room} characters")
        if problems:
            raise ValueError("\n  ".join(problems))
        return self

    @model_validator(mode="after")
    def _rules(self) -> Settings:
        """Rules across keys; every problem found is reported at once, each naming its key."""
        problems = [p for p in (self._operator_scope(), self._hf_endpoint_safe(), self._layout_problem(),
                                self._tokenspeed_problem())
                    if p] + self._name_problems() + self._engine_arg_problems() + self._api_cidr_problems() \
            + self._api_hostname_problems()
        if problems:
            raise ValueError("\n  ".join(problems))
        return self

    def _operator_scope(self) -> str | None:
        net = ipaddress.ip_network(self.operator_cidr)
        if isinstance(net, ipaddress.IPv6Network) and net.subnet_of(_V4_MAPPED):
            return (f"{NAMESPACE}:operatorCidr {self.operator_cidr} is an IPv4-mapped IPv6 range, which no rule "
                    "matches; give the IPv4 address itself, e.g. \"$(curl -4 -s https://ifconfig.me)/32\"")
        kind = _non_public(net)
        if kind is None or self.allow_private_operator_cidr:
            return None
        return (f"{NAMESPACE}:operatorCidr {self.operator_cidr} is {kind}: the VMs see your public address, so this "
                "locks you out while they bill; use \"$(curl -4 -s https://ifconfig.me)/32\", or set "
                f"{NAMESPACE}:allowPrivateOperatorCidr true if you reach the VMs over a private network (a VPN)")

    def _api_cidr_problems(self) -> list[str]:
        """operatorCidr's address classes for each apiAllowedCidrs entry, and a bound on what the list opens in all:
        two /1s are each refused by no per-entry rule, yet together they are the whole internet."""
        if self.api_allowed_cidrs is None:
            return []
        key = f"{NAMESPACE}:apiAllowedCidrs"
        problems = []
        nets = [ipaddress.ip_network(c) for c in self.api_allowed_cidrs]
        for net in nets:
            if isinstance(net, ipaddress.IPv6Network) and net.subnet_of(_V4_MAPPED):
                problems.append(f"{key} entry {net} is an IPv4-mapped IPv6 range, which no rule matches: it locks "
                                "every client out; give the IPv4 range itself")
            elif net.prefixlen < (IPV4_MIN_PREFIX if net.version == 4 else IPV6_MIN_PREFIX):
                widest = IPV4_MIN_PREFIX if net.version == 4 else IPV6_MIN_PREFIX
                problems.append(f"{key} entry {net} is wider than /{widest}, as operatorCidr may not be: it opens the "
                                f"API to {net.num_addresses:,} addresses of other networks")
            elif (kind := _non_public(net)) and not self.allow_private_operator_cidr:
                problems.append(f"{key} entry {net} is {kind}: clients reach the head from public addresses, so it "
                                f"lets no one in (set {NAMESPACE}:allowPrivateOperatorCidr true for a VPN)")
        for version, widest in ((4, IPV4_MIN_PREFIX), (6, IPV6_MIN_PREFIX)):
            ours = [n for n in nets if n.version == version]
            # typeshed types collapse_addresses per address family; the version filter above keeps the list within one.
            opened = sum(n.num_addresses for n in ipaddress.collapse_addresses(ours))  # type: ignore[type-var, misc]
            # Twice the widest single entry: room for one such network and a few addresses besides.
            limit = 2 * 2 ** ((32 if version == 4 else 128) - widest)
            if opened > limit:
                problems.append(f"{key} opens the API to {opened:,} IPv{version} addresses in all, more than two "
                                f"/{widest}s ({limit:,}): list the networks that need it, not the internet piecewise")
        return problems

    def _own_certificate_expiry(self) -> dt.datetime | None:
        if self.tls_certificate is None:
            return None
        from cryptography import x509

        return x509.load_pem_x509_certificates(self.tls_certificate.encode())[0].not_valid_after_utc

    def _api_hostname_problems(self) -> list[str]:
        if self.tls_certificate is None:
            return []
        if self.api_hostname is None:
            return [f"{NAMESPACE}:tlsCertificate needs {NAMESPACE}:apiHostname, the DNS name it was issued for: the "
                    "head's public IP is unknown before the first `up`, so clients and the readiness wait could "
                    f"check it against nothing else; set it with: pulumi config set {NAMESPACE}:apiHostname "
                    "api.example.com"]
        problem = tls_check.chain_problem(self.tls_certificate, self.api_hostname)
        return [f"{NAMESPACE}:tlsCertificate {problem}"] if problem else []

    def _tokenspeed_problem(self) -> str | None:
        """TokenSpeed: one node (its multi-node launch is not wired here), an image the user names, and the two
        loopback ports its launcher takes beside enginePort (control server, metrics)."""
        if self.engine_name != "tokenspeed":
            return None
        if self.nodes != 1:
            return (f"{NAMESPACE}:engine tokenspeed is supported on one node only ({NAMESPACE}:nodeCount 1); use "
                    "sglang across nodes")
        if not self.image:
            return (f"{NAMESPACE}:image is required with TokenSpeed: its release image "
                    f"{catalog.TOKENSPEED_IMAGE_REPO}:{catalog.TOKENSPEED_VERSION} is published without a digest this "
                    "project could check, so pin the one you trust (docker buildx imagetools inspect "
                    f"{catalog.TOKENSPEED_IMAGE_REPO}:{catalog.TOKENSPEED_VERSION}); set it with: pulumi config set "
                    f"{NAMESPACE}:image {catalog.TOKENSPEED_IMAGE_REPO}:{catalog.TOKENSPEED_VERSION}@sha256:<digest>")
        taken = {self.engine_port + 1: "TokenSpeed's control server (enginePort + 1)",
                 self.engine_port + 2: "TokenSpeed's metrics listener (enginePort + 2)"}
        for port in (self.api_port, self.peer_port):
            if port in taken:
                return (f"{NAMESPACE}:apiPort or peerPort {port} collides with {taken[port]}; pick another, e.g. "
                        f"{NAMESPACE}:enginePort 30000 with apiPort 8000")
        if self.engine_port + 2 > 65535:
            return f"{NAMESPACE}:enginePort {self.engine_port} leaves no room for TokenSpeed's two ports above it"
        return None

    def _layout_problem(self) -> str | None:
        if self.engine_layout is None:
            return None
        layout = catalog.VLLM_LAYOUTS[self.engine_layout]
        if self.engine_name != layout.engine or self.nodes != 1 or self.gpus_per_node_count != layout.gpus:
            return (f"{NAMESPACE}:engineLayout {self.engine_layout} is a layout of vLLM on one node of {layout.gpus} "
                    f"GPUs, and this stack runs {self.engine_name} on {self.nodes} x {self.gpus_per_node_count} "
                    f"GPUs; use {NAMESPACE}:topology b300x1-vllm, or remove it with: pulumi config rm "
                    f"{NAMESPACE}:engineLayout")
        return None

    def _flavor_matches(self) -> str | None:
        if self.topology != "custom" or self.flavor is None:
            return None
        match = _FLAVOR_GPUS.search(self.flavor)
        if not match:
            return None
        gpu, count = match["gpu"], int(match["count"])
        problems = []
        if count != self.gpus_per_node:
            problems.append(f"{NAMESPACE}:gpusPerNode is {self.gpus_per_node}")
        if not self.gpu.name.startswith(gpu + "-"):
            problems.append(f"{NAMESPACE}:gpuMemoryGb {self.gpu_memory_gb} means {self.gpu.name}")
        if not problems:
            return None
        return (f"{NAMESPACE}:flavor {self.flavor} has {count}x {gpu} per VM, but " + " and ".join(problems) +
                "; make them agree (the sizing guard would size the wrong cluster)")

    def _hf_endpoint_safe(self) -> str | None:
        match = _HF_ENDPOINT.fullmatch(self.hf_endpoint)
        if match is None or match["scheme"] != "http" or not self.hf_token_set:
            return None
        host = match["host"].strip("[]")
        if host == "localhost" or _is_loopback(host):
            return None  # the node's own loopback: the token never leaves the machine
        return (f"{NAMESPACE}:hfEndpoint {self.hf_endpoint} would receive hfToken in clear text over http://; use an "
                f"https:// mirror, or unset {NAMESPACE}:hfToken for a mirror that needs none")

    def _name_problems(self) -> list[str]:
        env = self.env_name
        if not _NAME.fullmatch(env):
            return [f"the default environment name {_show(env)} (kimi-<stack>) is not a Hyperstack name; set "
                    f"{NAMESPACE}:environmentName to 1-50 letters, digits, '-' or '_'"]
        longest = max((self.node_name(self.nodes - 1), f"{env}-key"), key=len)
        if len(longest) <= NAME_MAX:
            return []
        room = NAME_MAX - (len(longest) - len(env))
        where = f"{NAMESPACE}:environmentName" if self.environment_name else f"the stack name {self.stack!r}"
        return [f"{where} makes the name {longest!r} {len(longest)} characters; Hyperstack allows {NAME_MAX} (cut "
                f"short, every VM name would collide): set {NAMESPACE}:environmentName to at most {room} characters"]

    def _engine_arg_problems(self) -> list[str]:
        from components import launch  # launch builds the command line from these settings

        owned = launch.owned_flags(self)
        problems = []
        for arg in self.extra_engine_args:
            flag = launch.flag_name(arg)
            if flag is None:
                continue
            # argparse also takes an unambiguous prefix (--tp-s for --tp-size) unless allow_abbrev is off.
            hit = next((o for o in sorted(owned) if o == flag or (len(flag) > 3 and o.startswith(flag))), None)
            if hit:
                problems.append(f"{NAMESPACE}:extraEngineArgs may not set {hit} ({_show(arg)}): the program owns it; "
                                "set the matching key instead (apiPort, servedModelName, maxModelLen, engineLayout, "
                                "topology ...)")
        return problems

    # ---- derived values -------------------------------------------------------------------------

    @property
    def preset(self) -> catalog.Topology | None:
        return catalog.TOPOLOGIES.get(self.topology)

    @property
    def flavor_name(self) -> str:
        return self.preset.flavor if self.preset else _custom(self.flavor, "flavor")

    @property
    def nodes(self) -> int:
        return self.preset.node_count if self.preset else _custom(self.node_count, "nodeCount")

    @property
    def gpus_per_node_count(self) -> int:
        return self.preset.gpus_per_node if self.preset else _custom(self.gpus_per_node, "gpusPerNode")

    @property
    def gpu(self) -> catalog.GpuSpec:
        name = self.preset.gpu if self.preset else catalog.GPU_BY_MEMORY_GB[_custom(self.gpu_memory_gb, "gpuMemoryGb")]
        return catalog.GPUS[name]

    @property
    def engine_name(self) -> str:
        return self.preset.engine if self.preset else _custom(self.engine, "engine")

    @property
    def total_gpus(self) -> int:
        return self.nodes * self.gpus_per_node_count

    @property
    def tensor_parallel(self) -> int:
        # SGLang shards one model over every GPU of every node; vLLM runs one TP group on its one node.
        return self.total_gpus

    @property
    def layout(self) -> catalog.EngineLayout | None:
        """vLLM's layout on its one node (tp8 unless engineLayout says otherwise); None for other engines."""
        if self.engine_layout is not None:
            return catalog.VLLM_LAYOUTS[self.engine_layout]
        default = catalog.VLLM_LAYOUTS[catalog.DEFAULT_VLLM_LAYOUT]
        if self.engine_name != "vllm" or self.nodes != 1 or self.gpus_per_node_count != default.gpus:
            return None  # another engine, or a custom vLLM node that is not 8 GPUs: tensor parallel over all
        return default

    @property
    def client_context_window(self) -> int:
        """The context client configs are told: contextWindow when set, else what the layout holds per session,
        never beyond maxModelLen."""
        if "context_window" in self.model_fields_set or self.layout is None:
            return self.context_window
        return min(self.layout.context_window, self.max_model_len or self.layout.context_window)

    @property
    def model_spec(self) -> catalog.ModelSpec:
        return catalog.MODELS[self.model]

    @property
    def fit(self) -> sizing.FitReport:
        return sizing.check_fit(self.model_spec, self.gpu, self.nodes, self.gpus_per_node_count, self.tensor_parallel)

    @property
    def container_image(self) -> str:
        if self.image:
            return self.image
        # TokenSpeed has no default image: settings refuse the stack until kimi-cluster:image is set.
        return self.preset.image if self.preset else catalog.DEFAULT_IMAGE_BY_ENGINE.get(self.engine_name, "")

    @property
    def image_pinned(self) -> bool:
        return "@sha256:" in self.container_image

    @property
    def api_cidrs(self) -> list[str]:
        """Who may reach the API port: apiAllowedCidrs, else operatorCidr alone."""
        return list(self.api_allowed_cidrs or [self.operator_cidr])

    @property
    def proxy_container_image(self) -> str:
        return self.proxy_image or catalog.PROXY_IMAGE

    @property
    def vm_image(self) -> str:
        if self.os_image:
            return self.os_image
        if self.preset:
            return self.preset.os_image
        return catalog.OS_IMAGE_CUDA_13_2 if self.gpu.name.startswith("B") else catalog.OS_IMAGE_CUDA_12_8

    @property
    def region_choices(self) -> list[str]:
        """The regions the placement may choose from, in order of preference."""
        return list(self.regions) if self.regions is not None else [self.region]

    @property
    def env_name(self) -> str:
        return self.environment_name or f"kimi-{self.stack}"

    @property
    def served_name(self) -> str:
        return self.served_model_name or self.model

    @property
    def price(self) -> catalog.Price | None:
        if self.gpu_hourly_price_usd is not None:
            return catalog.Price(self.gpu_hourly_price_usd, "from config gpuHourlyPriceUsd", "stack config", "now")
        return catalog.PRICES.get(self.gpu.name)

    @property
    def hourly_cost_usd(self) -> float | None:
        one = sizing.hourly_cost_usd(self.price, self.total_gpus)
        if one is None or self.replicas == 1:
            return one
        front = self.front_usd_per_hour
        return None if front is None else round(one * self.replicas + front, 2)

    @property
    def api_price(self) -> catalog.ApiPrice:
        """The API's per-token price: the catalog's, with either side overridden from config."""
        base = catalog.MOONSHOT_API_PRICE
        if self.api_input_price_usd_per_m is None and self.api_output_price_usd_per_m is None:
            return base
        given = [k for k, v in (("apiInputPriceUsdPerM", self.api_input_price_usd_per_m),
                                ("apiOutputPriceUsdPerM", self.api_output_price_usd_per_m)) if v is not None]
        return catalog.ApiPrice(
            base.name,
            base.usd_per_m_input if self.api_input_price_usd_per_m is None else self.api_input_price_usd_per_m,
            base.usd_per_m_output if self.api_output_price_usd_per_m is None else self.api_output_price_usd_per_m,
            f"stack config {', '.join(NAMESPACE + ':' + k for k in given)} (otherwise: {base.source})", "now")

    @property
    def token_mix(self) -> catalog.TokenMix:
        if self.input_tokens_per_output_token is None:
            return catalog.AGENTIC_CODING_MIX
        return catalog.TokenMix(self.input_tokens_per_output_token,
                                f"stack config {NAMESPACE}:inputTokensPerOutputToken")

    def node_name(self, index: int) -> str:
        """Deterministic VM names let a re-run find a VM whose create answer was lost."""
        return f"{self.env_name}-node{index}"

    # ---- replicas and the front (replicas >= 2) ----------------------------------------------------------------

    def replica_node_name(self, replica: int, index: int) -> str:
        """Replica 0 keeps the names a one-replica stack has, so adding a replica never replaces a running VM."""
        return self.node_name(index) if replica == 0 else f"{self.env_name}-r{replica}-node{index}"

    @property
    def has_front(self) -> bool:
        return self.replicas > 1

    @property
    def front_name(self) -> str:
        return f"{self.env_name}-front"

    @property
    def front_vm_image(self) -> str:
        return self.front_os_image or catalog.FRONT_OS_IMAGE

    @property
    def front_usd_per_hour(self) -> float | None:
        """The front's hourly price (0 without a front); None when its flavor has no known price."""
        if not self.has_front:
            return 0.0
        if self.front_hourly_price_usd is not None:
            return self.front_hourly_price_usd
        spec = catalog.CPU_FLAVORS.get(self.front_flavor)
        return spec.usd_per_hour if spec else None

    @property
    def all_gpus(self) -> int:
        """GPUs billed across every replica (total_gpus is one replica's: its tensor-parallel group)."""
        return self.total_gpus * self.replicas

    def warnings(self) -> list[str]:
        out = []
        if not self.image_pinned:
            out.append(
                f"image {self.container_image!r} is a tag without a digest: the engine version can change under "
                f"you; pin it with {NAMESPACE}:image NAME@sha256:DIGEST"
            )
        if "@sha256:" not in self.proxy_container_image:
            out.append(
                f"proxyImage {self.proxy_container_image!r} is a tag without a digest: the proxy version can change "
                f"under you; pin it with {NAMESPACE}:proxyImage NAME@sha256:DIGEST"
            )
        for cidr in self.api_cidrs:
            net = ipaddress.ip_network(cidr)
            if net.prefixlen < WIDE_PREFIX[net.version]:
                out.append(f"apiAllowedCidrs entry {cidr} is wider than /{WIDE_PREFIX[net.version]}: "
                           f"{net.num_addresses:,} addresses may try keys against the API port")
        if not self.hf_token_set:
            out.append("hfToken is not set: anonymous hub downloads get tighter rate limits")
        if self.price is None:
            out.append(f"no price known for {self.gpu.name}; set {NAMESPACE}:gpuHourlyPriceUsd for a cost figure")
        net = ipaddress.ip_network(self.operator_cidr)
        if net.version == 4 and net.prefixlen < IPV4_WARN_PREFIX:
            out.append(f"{NAMESPACE}:operatorCidr {self.operator_cidr} lets {net.num_addresses:,} addresses reach SSH "
                       "and the API; narrow it to your own address if you can")
        expiry = self._own_certificate_expiry()
        if expiry is not None and expiry - dt.datetime.now(dt.UTC) < dt.timedelta(days=tls_check.RENEW_WARN_DAYS):
            out.append(f"{NAMESPACE}:tlsCertificate's leaf expires on {expiry:%Y-%m-%d}: every client refuses it from "
                       "then on; renew it, set it again and run pulumi up")
        for key in self.plain_credentials:
            out.append(f"{key} is set as a plain value: it sits unencrypted in Pulumi.{self.stack}.yaml and the "
                       f"state; set it again with: pulumi config set --secret {key} ...")
        return out


_V4_MAPPED = ipaddress.IPv6Network("::ffff:0:0/96")
# Ranges no public address is in, with the reason shown; documentation ranges are left to placeholders().
_NON_PUBLIC = [(ipaddress.ip_network(n), why) for n, why in (
    ("127.0.0.0/8", "a loopback range"), ("::1/128", "the loopback address"),
    ("169.254.0.0/16", "a link-local range"), ("fe80::/10", "a link-local range"),
    ("10.0.0.0/8", "a private range"), ("172.16.0.0/12", "a private range"), ("192.168.0.0/16", "a private range"),
    ("fc00::/7", "a private (unique local) range"), ("100.64.0.0/10", "a carrier-grade NAT range"),
    ("224.0.0.0/4", "a multicast range"), ("ff00::/8", "a multicast range"), ("240.0.0.0/4", "a reserved range"),
    ("0.0.0.0/8", "a 'this network' range"), ("::/128", "the unspecified address"),
)]


def _non_public(net: ipaddress.IPv4Network | ipaddress.IPv6Network) -> str | None:
    for other, why in _NON_PUBLIC:
        if other.version == net.version and net.overlaps(other):
            return why
    return None


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _alias_of(field_name: str) -> str:
    f = Settings.model_fields.get(field_name)
    return (f.alias if f and f.alias else field_name) if f else field_name


def _alias_in(model: type[BaseModel], field_name: str) -> str:
    f = model.model_fields.get(field_name)
    return f.alias if f is not None and f.alias else field_name


# An error quotes at most this many problems, each at most this long: a value a million items long (or one that
# YAML aliases blew up) makes one short message, not gigabytes of it.
ERROR_MAX_LINES = 20
ERROR_MAX_LINE = 600


def _bounded(lines: list[str]) -> list[str]:
    out = [line if len(line) <= ERROR_MAX_LINE else line[:ERROR_MAX_LINE - 4] + " ..." for line in lines]
    if len(out) > ERROR_MAX_LINES:
        out = out[:ERROR_MAX_LINES] + [f"... and {len(out) - ERROR_MAX_LINES:,} more problems"]
    return out


def _format_errors(err: ValidationError | None, extra: list[str] | None = None) -> str:
    lines = list(extra or [])
    for e in err.errors(include_input=False) if err is not None else []:
        loc = [str(p) for p in e["loc"]]
        key = _alias_of(loc[0]) if loc else ""
        if key == "kernelCache" and len(loc) > 1 and not loc[1].startswith(("function-", "dict[")):
            key = f"kernelCache.{_alias_in(KernelCacheSettings, loc[1])}"
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "missing":
            lines.append(f"{NAMESPACE}:{key} is required; {_how_to_set(key)}")
        elif e["type"] == "extra_forbidden":
            names = sorted(f"kernelCache.{f.alias or n}" for n, f in KernelCacheSettings.model_fields.items()
                           ) if key.startswith("kernelCache.") else sorted(config_keys())
            # The likely intended key first: the whole list is long enough that the error's bound may cut it.
            by_lower = {n.lower(): n for n in names}
            close = [by_lower[m] for m in difflib.get_close_matches(key.lower(), list(by_lower), n=1, cutoff=0.75)]
            hint = f" (did you mean {close[0]}?)" if close else ""
            lines.append(f"{NAMESPACE}:{key} is not a known setting{hint}; known settings: {', '.join(names)}")
        elif key:
            lines.append(f"{NAMESPACE}:{key}: {msg}; {_how_to_set(key)}")
        else:
            lines.append(msg)
    return "invalid stack configuration:\n  " + "\n  ".join(_bounded(lines))


def config_keys() -> list[str]:
    """Every key a user may set under kimi-cluster:, secrets included."""
    keys = [f.alias or name for name, f in Settings.model_fields.items()
            if name not in ("stack", "hf_token_set", "ssh_private_key_set", "kernel_cache_credentials_set",
                            "tls_private_key_set", "plain_credentials")]
    return keys + list(SECRET_KEYS)


DEPLOY_KEY_HINT = ("make a deploy key without a passphrase: ssh-keygen -t ed25519 -N '' -f ~/.ssh/kimi-deploy, then "
                   f"pulumi config set {NAMESPACE}:sshPublicKey \"$(cat ~/.ssh/kimi-deploy.pub)\" and "
                   f"pulumi config set --secret {NAMESPACE}:sshPrivateKey < ~/.ssh/kimi-deploy")


def _openssh_cipher(text: str) -> str | None:
    """The cipher name inside an `-----BEGIN OPENSSH PRIVATE KEY-----` block ("none" when unencrypted), or None.

    Format: "openssh-key-v1\\0", then a uint32-length-prefixed cipher name (OpenSSH's PROTOCOL.key).
    """
    body = re.search(r"-----BEGIN OPENSSH PRIVATE KEY-----(.*?)-----END OPENSSH PRIVATE KEY-----", text, re.S)
    if not body:
        return None
    try:
        blob = base64.b64decode("".join(body.group(1).split()), validate=True)
    except (ValueError, binascii.Error):
        return None
    magic = b"openssh-key-v1\0"
    if not blob.startswith(magic) or len(blob) < len(magic) + 4:
        return None
    size = int.from_bytes(blob[len(magic):len(magic) + 4], "big")
    return blob[len(magic) + 4:len(magic) + 4 + size].decode("ascii", "replace")


def private_key_problem(text: str) -> str | None:
    """Why `text` cannot serve as sshPrivateKey, or None. Never quotes the text: it is a secret.

    pulumi-command parses the key with golang.org/x/crypto/ssh.ParsePrivateKey and is given no passphrase, so a
    passphrase-protected key would fail every node step after the VMs are billing.
    """
    stripped = text.strip()
    if _SSH_PUBLIC_KEY.fullmatch(stripped.splitlines()[0] if stripped else ""):
        return "holds a public key (the .pub file); give the private half: --secret < ~/.ssh/kimi-deploy"
    if "\n" not in stripped and "PRIVATE KEY" not in stripped and stripped.startswith(("~", "/", "./", "$")):
        return ("looks like a file name, not the key itself: set the file's content with "
                f"pulumi config set --secret {NAMESPACE}:sshPrivateKey < FILE")
    cipher = _openssh_cipher(stripped)
    encrypted = (cipher not in (None, "none") or "Proc-Type: 4,ENCRYPTED" in stripped
                 or "-----BEGIN ENCRYPTED PRIVATE KEY-----" in stripped
                 or bool(re.search(r"^Encryption: (?!none\s*$)", stripped, re.M)))  # PuTTY's .ppk
    if encrypted:
        return "is protected by a passphrase, which the node commands cannot type; " + DEPLOY_KEY_HINT
    return None


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
    values: dict[str, Any] = {}
    internal = {name for name, f in Settings.model_fields.items() if f.alias and f.alias != name} | \
        {"stack", "hf_token_set", "ssh_private_key_set", "kernel_cache_credentials_set", "tls_private_key_set",
         "plain_credentials"}
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
    try:
        settings = Settings.model_validate(values)
    except ValidationError as err:
        raise SettingsError(_format_errors(err, secret_problems)) from None
    tls_key = raw.get("tlsPrivateKey")
    if settings.tls_certificate is not None and isinstance(tls_key, str) and tls_key:
        from components import tls_check

        problem = tls_check.key_problem(settings.tls_certificate, tls_key)
        if problem:
            secret_problems.append(f"{NAMESPACE}:tlsPrivateKey {problem}")
    if secret_problems:
        raise SettingsError(_format_errors(None, secret_problems))
    return settings


def strip_namespace(config: Mapping[str, Any]) -> dict[str, Any]:
    """`kimi-cluster:operatorCidr` -> `operatorCidr`; keys of other namespaces are dropped."""
    prefix = NAMESPACE + ":"
    return {k[len(prefix):]: v for k, v in config.items() if k.startswith(prefix)}


# Documentation ranges (RFC 5737, RFC 3849): a placeholder, never a real operator's address.
_DOC_NETS = [ipaddress.ip_network(n) for n in ("192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24", "2001:db8::/32")]


def placeholders(settings: Settings) -> list[str]:
    """Values still at the shipped placeholders; `pulumi up` refuses them, the offline plan only warns."""
    out = []
    net = ipaddress.ip_network(settings.operator_cidr)
    # typeshed types subnet_of per address family; the version test before it keeps the call within one.
    if any(net.version == d.version and net.subnet_of(d) for d in _DOC_NETS):  # type: ignore[arg-type]
        out.append(f"{NAMESPACE}:operatorCidr {settings.operator_cidr} is a documentation range (the shipped "
                   f"placeholder): set your own public address, e.g. pulumi config set {NAMESPACE}:operatorCidr "
                   f"\"$(curl -4 -s https://ifconfig.me)/32\"")
    if settings.ssh_public_key and "REPLACEWITHYOUROWN" in settings.ssh_public_key:
        out.append(f"{NAMESPACE}:sshPublicKey is the shipped placeholder; {_how_to_set('sshPublicKey')}")
    return out


def read_stack_file(path: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Read a Pulumi.<stack>.yaml: (kimi-cluster keys without namespace, every other key as written).

    Encrypted `secure:` values stay opaque; they only count as set.
    """
    import yaml  # only the offline tools read stack files; the program gets config from the engine

    try:
        with open(path, encoding="utf-8") as fh:
            doc = _load_yaml_bounded(fh, path) or {}
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
    for full_key in _stack_config_keys():
        if full_key.startswith(prefix):
            key = full_key[len(prefix):]
            # Secrets are read through get_secret below; here only the shapes of the SSH key, the bucket credentials
            # and the TLS key are checked (the text is not kept), so an encrypted key, a public one, credentials
            # without their ':' or a TLS key that is not the certificate's are refused before anything is billed.
            if key in ("sshPrivateKey", "kernelCacheCredentials", "tlsPrivateKey"):
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
