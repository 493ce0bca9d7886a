"""How a settings problem is told: the one SettingsError, each value shown bounded, each key with how to set it.

Every message names its key and a command that fixes it; a value is quoted through `shown` (repr, cut short) and a
whole error is bounded in lines and length, so no input, however large, makes a large message.
"""

from __future__ import annotations

import difflib
import reprlib
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ValidationError

from kimi_cluster.settings import catalog
from kimi_cluster.settings.keys import NAMESPACE, SECRET_KEYS

# Bounded repr: a value YAML aliases (or a huge JSON list) blew up is shown by its first few items, never built whole.
_REPR = reprlib.Repr()
_REPR.maxstring, _REPR.maxother, _REPR.maxlist, _REPR.maxdict, _REPR.maxlevel = 200, 60, 4, 4, 2


def shown(value: Any, limit: int = 60) -> str:
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
    "schedule": ('\'{"timeZone": "Europe/Berlin", "windows": [{"days": ["mon", "fri"], "start": "08:00", '
                 '"end": "19:00"}]}\''),
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
    "frontFlavor": catalog.FRONT_FLAVOR.name,
    "nodeTiming": '\'{"settleSeconds": 2, "pollSeconds": 5}\'',
    "frontOsImage": f"'{catalog.FRONT_OS_IMAGE}'",
    "idleStopMinutes": "60",
    "budgetUsd": "500",
    "caretakerApiKey": "<a second Hyperstack API key>",
    "caretakerTiming": '\'{"pollSeconds": 30}\'',
}


class SettingsError(ValueError):
    """Invalid stack configuration; the message names each offending key and how to fix it."""


def how_to_set(key: str) -> str:
    if "." in key:  # a field of an object setting
        return f"set it with: pulumi config set --path {NAMESPACE}:{key} {EXAMPLES.get(key, 'VALUE')}"
    secret = "--secret " if key in SECRET_KEYS else ""
    return f"set it with: pulumi config set {secret}{NAMESPACE}:{key} {EXAMPLES.get(key, 'VALUE')}"


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



def close_match(key: str, names: Sequence[str]) -> str | None:
    """The name `key` was most likely meant to be (case aside), or None: the one rule for every unknown-key hint."""
    by_lower = {n.lower(): n for n in names}
    close = [by_lower[m] for m in difflib.get_close_matches(key.lower(), list(by_lower), n=1, cutoff=0.75)]
    return close[0] if close else None


def format_errors(err: ValidationError | None, extra: list[str] | None, *, model: type[BaseModel],
                  nested: Mapping[str, type[BaseModel]], known: Sequence[str]) -> str:
    """One message for every problem: `extra` lines first, then each of `err`'s, naming its config key (a field of
    an object key in `nested` as key.field) and how to set it. `known`: every top-level key, for the unknown-key
    hint."""
    lines = list(extra or [])
    for e in err.errors(include_input=False) if err is not None else []:
        loc = [str(p) for p in e["loc"]]
        key = _alias_in(model, loc[0]) if loc else ""
        if key in nested and len(loc) > 1 and not loc[1].startswith(("function-", "dict[")):
            key = f"{key}.{_alias_in(nested[key], loc[1])}"
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "missing":
            lines.append(f"{NAMESPACE}:{key} is required; {how_to_set(key)}")
        elif e["type"] == "extra_forbidden":
            outer = key.partition(".")[0]
            names = sorted(f"{outer}.{f.alias or n}" for n, f in nested[outer].model_fields.items()
                           ) if "." in key and outer in nested else sorted(known)
            # The likely intended key first: the whole list is long enough that the error's bound may cut it.
            close = close_match(key, names)
            hint = f" (did you mean {close}?)" if close else ""
            lines.append(f"{NAMESPACE}:{key} is not a known setting{hint}; known settings: {', '.join(names)}")
        elif key:
            lines.append(f"{NAMESPACE}:{key}: {msg}; {how_to_set(key)}")
        else:
            lines.append(msg)
    return "invalid stack configuration:\n  " + "\n  ".join(_bounded(lines))
