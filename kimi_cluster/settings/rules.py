"""The value rules of the stack config: what each single key may hold, as constants and pure functions.

Each function takes one raw or parsed value and returns it (normalized) or raises ValueError with the message the
settings error shows for its key; kimi_cluster/settings/model.py's validators call them. Rules across several keys are
in cross_rules.py, the SSH key's in ssh_key.py; the port map is ports.py, what kind of network an address is
networks.py.
"""

from __future__ import annotations

import json
import math
import posixpath
import re
from typing import Any

from kimi_cluster.settings import catalog
from kimi_cluster.settings.errors import shown
from kimi_cluster.settings.keys import NAMESPACE
from kimi_cluster.settings.networks import IPV4_MIN_PREFIX, IPV6_MIN_PREFIX, cidr_network, is_ip, on_private_path
from kimi_cluster.settings.timing import PIP_BUDGET_S, Timing

# Every pattern is used with fullmatch: a `$` also matches before a trailing newline, which would let one through.
_HEX40 = re.compile(r"[0-9a-f]{40}")
# Hyperstack's limit on environment, keypair and VM names (CreateEnvironment / CreateInstancesPayload).
NAME_MAX = 50
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,49}")
REGION_RE = re.compile(r"[A-Z0-9][A-Z0-9-]{0,39}")
FLAVOR_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
# A GPU model and a per-VM count in a flavor name, as Hyperstack names them: n3-H100x8-NVLink, n3-B300-SXM6x8.
FLAVOR_GPUS_RE = re.compile(r"(?:^|-)(?P<gpu>[A-Z]\d{3})[A-Za-z0-9-]*?x(?P<count>\d+)(?:-|$)")
# Printable text: no control characters (a newline would start a new shell line in a log or a script).
PRINTABLE_RE = re.compile(r"[^\x00-\x1f\x7f]+")
SERVED_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,127}")
# A login name as Debian's adduser accepts it (NAME_REGEX), at most 32 characters.
SSH_USER_RE = re.compile(r"[a-z_][a-z0-9_-]{0,31}")
# A container image reference: [registry[:port]/]path[:tag][@algorithm:hex] (distribution/reference's grammar), the
# digest of its algorithm's exact length (opencontainers/go-digest: sha256 is 64 lower-case hex): a shorter one is no
# digest, and would hide the "no digest" warning.
_IMAGE_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_IMAGE_DOMAIN = r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*(?::\d+)?/)"
IMAGE_RE = re.compile(rf"{_IMAGE_DOMAIN}?{_IMAGE_COMPONENT}(?:/{_IMAGE_COMPONENT})*(?::[\w][\w.-]{{0,127}})?"
                    r"(?:@(?:sha256:[0-9a-f]{64}|sha384:[0-9a-f]{96}|sha512:[0-9a-f]{128}))?")
# A DNS name of two or more labels (RFC 1123), lower case: it lands in URLs, client configs and the readiness wait.
_HOSTNAME = re.compile(r"(?:[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?\.)+[a-z](?:[a-z0-9-]{0,61}[a-z0-9])?")
# Paths the node scripts write into: plain characters only, so a path is one shell word whatever the quoting.
PATH_CHARS_RE = re.compile(r"[A-Za-z0-9._/-]+")
# storagePath may not be, or lie under, these: the scripts create, chown and fill it (Docker's data-root goes there).
_SYSTEM_TREES = ("/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/proc", "/run", "/sbin",
                 "/sys", "/usr")
_SYSTEM_DIRS = ("/", "/home", "/media", "/mnt", "/opt", "/root", "/snap", "/srv", "/tmp", "/var")
HF_ENDPOINT_RE = re.compile(r"(?P<scheme>https?)://(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?)"
                          r"(?::(?P<port>\d{1,5}))?(?P<path>/[A-Za-z0-9._~/-]*)?")
# The longest list a list key takes (extraEngineArgs, apiAllowedCidrs, regions): far beyond any real use, and short
# enough that each item's error stays cheap to build.
MAX_LIST_ITEMS = 256


# ---- durations: one rule for every key that makes one --------------------------------------------------------------
# Each node step's deadline becomes its custom_timeouts as a Go duration (kimi_cluster/settings/timing.py
# Timing.custom_timeout),
# and Go's time.ParseDuration stops near 2,562,047 hours (int64 nanoseconds): a longer one fails the registration
# after the VMs bill. A week is far inside that and longer than any step's real need (the weight download's default
# is 4 hours). Three seconds is the floor: below it `timeout` ends a step before its prelude has printed a line (the
# hung-step tests use 3 and 6 s deadlines on purpose); the whole-minute keys start at one minute anyway.
DURATION_MIN_MINUTES = 0.05
DURATION_MAX_MINUTES = 7 * 24 * 60
# What a kernel-cache step needs before its transfer starts: installing its S3 client (kimi_cluster/settings/timing.py
# PIP_BUDGET_S), the step's slack (Timing.deadline_slack_s), and a minute of transfer. A shorter step deadline would
# kill the step itself, failing `up`, where the transfer's own deadline only ever warns.
CACHE_STEP_MIN_MINUTES = (PIP_BUDGET_S + Timing().deadline_slack_s + 60) / 60
# Every other step's floor: none's own work on a fresh VM is done in less than a minute (nodeTiming's timeouts have the
# same floor), and a step stopped mid-way fails `up` at full cost, or leaves its work half done (a warm-up in its
# `docker rm`); the warm-up's own floor also counts nodeTiming.dockerTimeoutS (node_timing.deadline_problems).
STEP_MIN_MINUTES = 1.0


def duration_problem(value: Any, low: float = DURATION_MIN_MINUTES, high: float = DURATION_MAX_MINUTES) -> str | None:
    """Why `value` cannot be a number of minutes in [low, high], or None; the one rule for every duration key."""
    number: Any = value
    if isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            return f"{shown(value)} is not a number of minutes"
    if isinstance(number, bool) or not isinstance(number, (int, float)):
        return f"{shown(value)} is not a number of minutes"
    if isinstance(number, float) and not math.isfinite(number):
        return f"{shown(value)} is not a finite number of minutes"
    if number <= 0:
        return f"{shown(value)} is not a positive number of minutes"
    if number < low:
        return f"{shown(value)} minutes is shorter than {low:g} minutes ({low * 60:g} s), which no step can meet"
    if number > high:
        return (f"{shown(value)} minutes is longer than {high:g} minutes ({high / 1440:g} days); Pulumi's custom "
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
    match = HF_ENDPOINT_RE.fullmatch(v)
    if not match or int(match["port"] or 1) not in range(1, 65536):
        return (f"{shown(v)} is not a URL such as https://huggingface.co (scheme, host, optional port and path; no "
                "query, no spaces)")
    return None


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


PREFIX_RE = re.compile(r"^[A-Za-z0-9._/-]*$")
S3_REGION_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,40}$")


# ---- the keys' own rules (the model's field validators call these) ------------------------------------------------


def bucket_name(v: str) -> str:
    if not _BUCKET.fullmatch(v) or any(p in v for p in ("..", ".-", "-.")):
        raise ValueError(f"{shown(v)} is not an S3 bucket name (3-63 lowercase letters, digits, '.' or '-', "
                         "beginning and ending with a letter or digit)")
    if re.fullmatch(r"\d+\.\d+\.\d+\.\d+", v) or v.startswith(_BUCKET_RESERVED_PREFIXES) \
            or v.endswith(_BUCKET_RESERVED_SUFFIXES):
        raise ValueError(f"{shown(v)} is an IP address or uses a prefix or suffix S3 reserves (xn--, sthree-, "
                         "-s3alias, --ol-s3, ...): no S3 store accepts it as a bucket name")
    return v


def endpoint_url(v: str | None) -> str | None:
    if v is None:
        return v
    problem = url_problem(v, "kernelCacheCredentials")
    if problem:
        raise ValueError(problem)
    match = HF_ENDPOINT_RE.fullmatch(v)
    if match and match["scheme"] == "http" and not on_private_path(match["host"]):
        # The archive holds compiled kernels the engine runs, and the manifest that vouches for it: over plain
        # http, anyone on the path can swap both.
        raise ValueError(f"{shown(v)} is plain http:// to a host outside loopback and private networks: anyone on "
                         "the path could swap the kernel archive (code the engine runs); use https://")
    return v.rstrip("/")


def operator_cidr(v: str) -> str:
    try:
        net = cidr_network(str(v))
    except ValueError:
        raise ValueError(f"{shown(v)} is not a CIDR such as 203.0.113.7/32") from None
    if net.prefixlen == 0:
        raise ValueError(
            f"{shown(v)} opens SSH and the API to the whole internet; use your own address, e.g. 203.0.113.7/32"
        )
    if net.version == 6 and net.prefixlen < IPV6_MIN_PREFIX:
        # A /48 is one site; anything wider spans many customers of an ISP (RFC 6177).
        raise ValueError(
            f"{shown(v)} is wider than one site (/{IPV6_MIN_PREFIX}) and opens SSH and the API to other networks; "
            f"use your own address (/128) or at most your site's /{IPV6_MIN_PREFIX}, e.g. "
            f"\"$(curl -4 -s https://ifconfig.me)/32\" for your IPv4 address"
        )
    if net.version == 4 and net.prefixlen < IPV4_MIN_PREFIX:
        raise ValueError(
            f"{shown(v)} opens SSH and the API to {2 ** (32 - net.prefixlen):,} addresses of other networks; "
            "use your own address, e.g. \"$(curl -4 -s https://ifconfig.me)/32\""
        )
    return str(net)


def os_image(v: str | None) -> str | None:
    """osImage and frontOsImage: an image name as Hyperstack lists them, sent to the API as it is written."""
    # isprintable: no control character, and no Unicode separator or format character (U+2028, a zero-width space).
    if v is not None and (not v.isprintable() or v != v.strip() or len(v) > 200):
        raise ValueError(f"{shown(v)} is not an image name as Hyperstack lists them (at most 200 printable "
                         "characters, no surrounding spaces), e.g. 'Ubuntu Server 24.04 LTS R570 CUDA 12.8 with "
                         "Docker'")
    return v


def front_flavor(v: str) -> str:
    """The front runs Caddy alone: a CPU flavor of the catalog (catalog.CPU_FLAVORS), which prices it."""
    if v in catalog.CPU_FLAVORS:
        return v
    known = ", ".join(catalog.CPU_FLAVORS)
    if FLAVOR_GPUS_RE.search(v):
        raise ValueError(f"{shown(v)} is a GPU flavor: the front only runs Caddy in front of the replicas, so it "
                         f"bills GPUs for nothing; use a CPU flavor of the catalog: {known}")
    raise ValueError(f"{shown(v)} is not a CPU flavor of the catalog (kimi_cluster/settings/catalog.py, which also "
                     "prices it); "
                     f"known: {known}")


def cidr_list(v: Any) -> Any:
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
            net = cidr_network(cidr)
        except ValueError:
            raise ValueError(f"{shown(cidr)} is not a CIDR such as 203.0.113.7/32 or 198.51.100.0/24") from None
        if net.prefixlen == 0:
            raise ValueError(f"{shown(cidr)} opens the API to the whole internet; list the networks that need it")
        if str(net) not in out:
            out.append(str(net))
    return out


def certificate(v: str | None) -> str | None:
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


def api_hostname(v: str | None) -> str | None:
    if v is None:
        return v
    if not _HOSTNAME.fullmatch(v) or len(v) > 253 or is_ip(v):
        raise ValueError(f"{shown(v)} is not a DNS name such as api.example.com (lower-case letters, digits and "
                         "'-' in dot-separated labels; no scheme, port or trailing dot)")
    return v


def revision(v: str) -> str:
    if not _HEX40.fullmatch(v):
        raise ValueError(
            f"{shown(v)} is not a 40-hex commit; a branch or tag can move, so the deployment would not be "
            "reproducible. Pin the commit shown on the model's hub page"
        )
    return v


def hf_endpoint(v: str) -> str:
    problem = url_problem(v, "hfToken")
    if problem:
        raise ValueError(problem)
    match = HF_ENDPOINT_RE.fullmatch(v)
    return v.rstrip("/") if match and match["path"] else v


def engine_arg_list(v: Any) -> Any:
        # `pulumi config set` stores a list as a JSON string unless --path is used
    if isinstance(v, str):
        try:
            v = json.loads(v)
        except (ValueError, RecursionError):  # RecursionError: nested past Python's stack
            raise ValueError("expected a JSON list of strings, e.g. '[\"--enable-metrics\"]'") from None
    if isinstance(v, list) and len(v) > MAX_LIST_ITEMS:
        raise ValueError(f"{len(v):,} arguments; at most {MAX_LIST_ITEMS} are taken")
    return v


def region_list(v: Any) -> Any:
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
        if not all(isinstance(r, str) and REGION_RE.fullmatch(r) for r in v):
            raise ValueError("each region is a Hyperstack region name such as CANADA-1")
        if len(set(v)) != len(v):
            raise ValueError("a region is listed twice")
    return v


def step_deadlines(v: Any) -> Any:
    expected = 'expected a JSON object of step -> minutes, e.g. \'{"image": 120}\''
    v = json_text_object(v, expected)
    if not isinstance(v, dict):
        raise ValueError(expected)
    # The step names, and each step's own floor, are the step table's: kimi_cluster/plan/admission.py checks them.
    for step, minutes in v.items():
        if isinstance(minutes, bool) or not isinstance(minutes, (int, float)):
            raise ValueError(f"{step}: {shown(minutes)} is not a positive number of minutes")
        problem = duration_problem(minutes)
        if problem is None and minutes < STEP_MIN_MINUTES:
            problem = (f"{shown(minutes)} minutes is shorter than {STEP_MIN_MINUTES:g}, less than the step's own work "
                       "takes on a fresh VM: stopped mid-way, it fails `up` or leaves its work half done")
        if problem:
            raise ValueError(f"{step}: {problem}")
    return v


def json_text_object(v: Any, expected: str) -> Any:
    """An object-valued key's value: text is parsed as JSON and must be an object, else ValueError(`expected`).

    `pulumi config set kimi-cluster:key '{...}'` stores a JSON string; `--path` stores the object itself, which is
    returned as it is for the caller (or pydantic) to check.
    """
    if not isinstance(v, str):
        return v
    try:
        v = json.loads(v)
    except (ValueError, RecursionError):  # RecursionError: nested past Python's stack
        raise ValueError(expected) from None
    if not isinstance(v, dict):
        raise ValueError(expected)
    return v


def json_object(v: Any) -> Any:
    return json_text_object(v, 'expected a JSON object, e.g. \'{"bucket": "my-team-kimi-kernels"}\'')


def storage_path(v: str) -> str:
    if not PATH_CHARS_RE.fullmatch(v) or not v.startswith("/") or posixpath.normpath(v) != v \
            or ".." in v.split("/"):
        raise ValueError(f"{shown(v)} must be a normalized absolute path of letters, digits and . _ - /, "
                         "e.g. /ephemeral")
    if v in _SYSTEM_DIRS or any(v == t or v.startswith(t + "/") for t in _SYSTEM_TREES):
        raise ValueError(f"{v} is a system directory; the scripts fill it with weights and move Docker's data "
                         "there: use the VM's large local disk, e.g. /ephemeral")
    return v
