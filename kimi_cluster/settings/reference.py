"""The configuration reference (docs/configuration.md), generated from the settings model.

Each key's type, choices, bounds and default come from `Settings` (and `KernelCacheSettings` for kernelCache's
fields); only what a model cannot say is written here: a default that depends on other keys, and what the key means.
`kimi-cluster config-reference --write` puts the table into docs/configuration.md between its markers;
tests/settings/test_reference.py fails when the file and the model disagree, or a key has no note here.
"""

from __future__ import annotations

import math
import types
import typing
from typing import Any, Literal

from annotated_types import Ge, Gt, Le, Lt
from pydantic.fields import FieldInfo

from kimi_cluster.settings.kernel_cache_store import KernelCacheSettings
from kimi_cluster.settings.keys import SECRET_KEYS
from kimi_cluster.settings.model import Settings
from kimi_cluster.settings.work_model import engine_start_s, image_pull_s, render_server_s

BEGIN = "<!-- BEGIN GENERATED REFERENCE: kimi-cluster config-reference --write -->"
END = "<!-- END GENERATED REFERENCE -->"
_INTERNAL = ("stack", "hf_token_set", "ssh_private_key_set", "kernel_cache_credentials_set", "tls_private_key_set",
             "plain_credentials", "caretaker_api_key_set")


def _floor(seconds: float) -> int:
    """A step's floor in whole minutes, as kimi_cluster/plan/admission.py refuses below it."""
    return math.ceil(seconds / 60)


# key -> (the default when the model has none of its own to show, what the key means); in the table's order.
NOTES: dict[str, tuple[str, str]] = {
    'topology': (
        '`h100x4-sglang`',
        '`h100x4-sglang`, `b300x1-vllm`, `b300x1-tokenspeed` or `custom`'),
    'flavor': (
        '(custom only)',
        'Hyperstack flavor name'),
    'nodeCount': (
        '(custom only)',
        'number of VMs'),
    'gpusPerNode': (
        '(custom only)',
        'GPUs per VM'),
    'gpuMemoryGb': (
        '(custom only)',
        'memory per GPU as sold: 80, 141, 192 or 288'),
    'engine': (
        '(custom only)',
        '`sglang` (multi-node), `vllm` or `tokenspeed` (one node)'),
    'gpuHourlyPriceUsd': (
        'catalog price',
        'price per GPU-hour, for GPUs the catalog has no price for'),
    'region': (
        '`CANADA-1`',
        'Hyperstack region (the one-region form of `regions`)'),
    'regions': (
        '',
        'ordered preference list, a JSON list such as `\'["CANADA-1", "NORWAY-1"]\'`; not together with `region`'),
    'environmentName': (
        '`kimi-<stack>`',
        'Hyperstack environment (unique per organisation, max 50 characters)'),
    'operatorCidr': (
        '**required**',
        'the only source allowed to reach SSH (and the API unless `apiAllowedCidrs` is set); see [What is '
        'refused](#what-is-refused-and-why)'),
    'apiAllowedCidrs': (
        '`[operatorCidr]`',
        'JSON list of CIDRs that reach the API port (one firewall rule each, head only); `0.0.0.0/0`, `::/0` and '
        'non-CIDRs are refused, wider than /16 (IPv6 /48) warned about; changing it replaces rules only'),
    'apiKeyVersion': (
        '`1`',
        'bump it to rotate the API key: the old key gets 401 after `up`, the engine keeps running'),
    'allowPrivateOperatorCidr': (
        '`false`',
        'accept a private or loopback `operatorCidr` (a VPN into the cloud, the sandbox)'),
    'sshPublicKey': (
        '',
        'OpenSSH public key, imported as a keypair'),
    'keypairName': (
        '',
        'reuse an existing keypair in the environment instead'),
    'sshPrivateKey': (
        '**required, secret**',
        'used by the node commands over SSH'),
    'sshUser': (
        '`ubuntu`',
        'login user on the VM image'),
    'hfToken': (
        'secret, optional',
        'Hugging Face token; reaches the nodes on stdin only'),
    'hfEndpoint': (
        '`https://huggingface.co`',
        'hub or mirror to download from'),
    'model': (
        '`moonshotai/Kimi-K3.1-Pro`',
        'model repository (must have sizing data in the catalog)'),
    'modelRevision': (
        '`6d0a0202956796543364d666ab19c6ad1a494ee1`',
        '40-hex commit; branch names are refused'),
    'servedModelName': (
        'the model id',
        'name the API serves the model under'),
    'image': (
        'per topology; **required** with TokenSpeed',
        'container image; a tag without `@sha256:` digest is allowed but warned about'),
    'osImage': (
        'per topology',
        'Hyperstack OS image name'),
    'apiPort': (
        '`8000`',
        "the TLS proxy's port on the head (the only API port)"),
    'enginePort': (
        '`30000`',
        "the engine's port on the head's loopback, behind the proxy"),
    'proxyImage': (
        '`caddy:2.11.7-alpine@sha256:d854...`',
        "the proxy's image; a tag without digest is warned about"),
    'tlsCertificate': (
        "(the stack's own CA)",
        'your own server certificate chain (PEM, leaf first, ending with the CA clients trust)'),
    'tlsPrivateKey': (
        'secret, with `tlsCertificate`',
        'its private key (`pulumi config set --secret kimi-cluster:tlsPrivateKey < server.key`)'),
    'apiHostname': (
        "(the head's IP)",
        "the DNS name clients use (you keep its record pointing at the head's public IP): the endpoint URLs, client "
        "configs and the readiness wait's TLS check use it, the stack's own certificate names it too; required with "
        '`tlsCertificate`, which must name it'),
    'maxModelLen': (
        'engine default',
        'maximum context length passed to the engine'),
    'engineLayout': (
        '`tp8` (vLLM, one node)',
        "how vLLM places the model on the node's 8 GPUs: `tp8`, `dp8-ep` (throughput) or `tp8-dcp8` (long context); "
        'see the topology table'),
    'contextWindow': (
        '`131072`, `1048576` with `tp8-dcp8`',
        'context size written into client configs; `1048576` by default with `tp8-dcp8`; unset, it follows the '
        'layout and never exceeds `maxModelLen`'),
    'extraEngineArgs': (
        '`[]`',
        'extra engine flags, a JSON list'),
    'nodeRoot': (
        '`/`',
        'prefix for every system path the node scripts touch (a chroot or a test root)'),
    'storagePath': (
        '`/ephemeral`',
        'large local disk for weights, Docker data and kernel caches'),
    'diskMarginGb': (
        '`100`',
        'free space required beyond the checkpoint'),
    'downloadWorkers': (
        '`16`',
        'parallel file downloads per node'),
    'hubStreamMinMBps': (
        '`10`',
        'MB/s: a hub stream below this (or below `hubStreamFloorShare` of its fastest sibling) for a window is '
        're-opened on a new connection from the byte it reached; just above the 8.7 MB/s a capped CDN edge gives '
        '(see [The hub download](ARCHITECTURE.md#weights-from-the-hub-slow-edges-and-the-tail))'),
    'hubStreamFloorShare': (
        '`0.3`',
        "a hub stream's floor as a share of the fastest rate its sibling streams reached in their last windows "
        '(never below `hubStreamMinMBps`)'),
    'hubStreamWindowSeconds': (
        '`3`',
        "seconds: the least window a hub stream's rate is measured over before it is judged against its floor; its "
        "window is 4% of the time its range has left at its siblings' rate, never less; doubles every third re-open "
        'of the same range'),
    'downloadTimeoutMinutes': (
        '`240`',
        'deadline for the weight download'),
    'readinessTimeoutMinutes': (
        '`60`',
        'deadline for the endpoint to answer'),
    'stepDeadlineMinutes': (
        'per step',
        'JSON object `{"step": minutes}` overriding a node step\'s deadline (see below); a minute at least, more '
        'for the cache steps and the warm-up, and for the steps whose own work takes longer in the plan\'s timing '
        f'model (kimi_cluster/settings/work_model.py): `image` {_floor(image_pull_s())}, `resume` '
        f'{_floor(render_server_s())}, `engine-ready` and `readiness` {_floor(engine_start_s(False))} '
        f'({_floor(engine_start_s(True))} with `kernelWarmup` or `kernelCache`; `readiness` behind a front: 1)'),
    'nodeTiming': (
        '(the defaults in `kimi_cluster/settings/timing.py`)',
        "advanced: JSON object overriding the node scripts' waits and retries, camelCase names of `Timing`'s fields,"
        ' e.g. `\'{"settleSeconds": 1, "pollSeconds": 5}\'` (the sandbox shortens the launch and proxy settle checks);'
        ' each a positive number (whole where the field is), at most a day (`pollSeconds` an hour, `pullAttempts` '
        '100); an unknown name is refused with the closest known one'),
    'verifySha256': (
        '`true`',
        "check every file's sha256 against the hub's manifest (free: hashed while it streamed)"),
    'kernelWarmup': (
        '`false`',
        "compile the engine's kernels from the model's shapes, on random weights, while the weights download; the "
        'launch then finds them compiled, or starts cold if the warm-up failed (see [Kernel '
        'warm-up](warm-up.md))'),
    'kernelCache': (
        '(off)',
        'where compiled kernels are kept between bring-ups: a JSON object, see [Kernel '
        'cache](operations.md#kernel-cache-across-destroy-and-up)'),
    'kernelCacheCredentials': (
        'secret, required with `kernelCache`',
        '`ACCESS_KEY_ID:SECRET_ACCESS_KEY` of the bucket; reaches the nodes on stdin only'),
    'peerPort': (
        '`20100`',
        "port each node serves its finished weight files on, to its peers' private addresses only"),
    'apiInputPriceUsdPerM': (
        '`2.00`',
        "the model API's price per 1M input tokens, for the break-even in the plan and the cost per token in "
        "`status` (catalog: Moonshot's listed rate, 2026-11-10)"),
    'apiOutputPriceUsdPerM': (
        '`10.00`',
        "the API's price per 1M output tokens (same source)"),
    'inputTokensPerOutputToken': (
        '`293.7`',
        'input tokens sent per output token, for the break-even (default: the SyFI Trace Atlas of Claude Code and '
        'Codex sessions, see [Break-even](sizing.md#break-even-against-the-api))'),
    'replicas': (
        '`1`',
        'whole engine groups (4 nodes for `h100x4-sglang`, 1 for `b300x1-vllm`) behind one front; 2 to 8; see '
        '[Replicas behind one front](operations.md#replicas-behind-one-front)'),
    'frontFlavor': (
        '`n1-cpu-small`',
        "the front's CPU flavor (replicas 2 or more)"),
    'frontOsImage': (
        "the GPU nodes' image",
        "the front's OS image; it needs Docker"),
    'frontHourlyPriceUsd': (
        'catalog price',
        "the front's price per VM-hour, for a flavor the catalog has no price for"),
    'resumeStreams': (
        '`true`',
        'behind a front (replicas 2 or more) with vLLM or SGLang (not TokenSpeed): a stream in flight when its '
        'replica is lost carries on on another replica from the tokens already sent; `false` leaves streams to end '
        'with an error as before; see '
        '[Replicas behind one front](operations.md#replicas-behind-one-front)'),
    'idleStopMinutes': (
        '(off)',
        'the caretaker deletes the GPU VMs after this many minutes without an inference request (a POST) through '
        'the proxy (GETs such as /health and 401s do not count); 15 to 10080; needs `caretakerApiKey`; see [the '
        'caretaker](caretaker.md)'),
    'budgetUsd': (
        '(off)',
        "a hard limit in US dollars for the stack's GPU VMs since their first `up`, as Hyperstack bills them: the "
        'caretaker warns at 80 % and deletes the GPU VMs at 100 %; `up` refuses a budget already spent; needs '
        '`caretakerApiKey` and a priced GPU (the catalog\'s, or `gpuHourlyPriceUsd`)'),
    'schedule': (
        '(off)',
        'working hours, a JSON object: `timeZone` (an IANA name) and `windows`, each with `days` (mon..sun), `start` '
        'and `end` (HH:MM, end up to 24:00) and `replicas` (up to `replicas`); outside every window the caretaker '
        'deletes the GPU VMs and `kimi-cluster schedule` brings them back before the next; needs `caretakerApiKey`; '
        '`earlyStart: true` (a stack with a front only) lets a keyed `POST /kimi/early-start` outside the hours ask '
        'the scheduler for an early up, within `budgetUsd`; see [the caretaker](caretaker.md#working-hours)'),
    'caretakerApiKey': (
        'secret, required with a guard',
        "the caretaker's own Hyperstack API key, one line of printable characters; reaches the VM on stdin only and "
        'sits there root-only (whoever gets root on that VM holds the account)'),
    'caretakerApiUrl': (
        '`https://infrahub-api.nexgencloud.com/v1`',
        'the Hyperstack API as the caretaker dials it from its VM: a URL ending in `/v1`, https, or http to a '
        'loopback or private address'),
    'caretakerTiming': (
        '`{"pollSeconds": 60, "minuteSeconds": 60}`',
        "JSON object: how often the caretaker looks, and its minute's length in seconds; a minute below 60 s only "
        'with an emulator as `caretakerApiUrl` (plain http to loopback or a private address: the sandbox)'),
}


def _code(value: Any) -> str:
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, (list, dict)):
        return f"`{value!r}`".replace("'", '"')
    return f"`{value}`"


def _kind(annotation: Any) -> tuple[str, list[str]]:
    """(what a value is, the choices when there are a few) of a field's annotation, None left out."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and len(args) == 1:
        annotation = args[0]
    if typing.get_origin(annotation) is Literal:
        return "one of", [str(a) for a in typing.get_args(annotation)]
    origin = typing.get_origin(annotation) or annotation
    names = {bool: "true or false", int: "a whole number", float: "a number", str: "text", list: "a JSON list",
             dict: "a JSON object", KernelCacheSettings: "a JSON object"}
    return names.get(origin, str(annotation)), []


def _bounds(field: FieldInfo) -> str:
    words = []
    for item in field.metadata:
        if isinstance(item, Ge):
            words.append(f">= {item.ge}")
        elif isinstance(item, Gt):
            words.append(f"> {item.gt}")
        elif isinstance(item, Le):
            words.append(f"<= {item.le}")
        elif isinstance(item, Lt):
            words.append(f"< {item.lt}")
    return ", ".join(words)


def _rule(field: FieldInfo) -> str:
    kind, choices = _kind(field.annotation)
    text = f"{kind} " + ", ".join(f"`{c}`" for c in choices) if choices else kind
    bounds = _bounds(field)
    if bounds:
        text += f", {bounds}"
    if field.annotation is KernelCacheSettings or KernelCacheSettings in typing.get_args(field.annotation):
        parts = [f"`{f.alias or n}`" + (" (required)" if f.is_required() else f" ({_plain_default(f)})")
                 for n, f in KernelCacheSettings.model_fields.items()]
        text += ": " + ", ".join(parts)
    return text


def _plain_default(field: FieldInfo) -> str:
    if field.default_factory is not None:
        return _code(field.get_default(call_default_factory=True))
    return _code(field.default) if field.default is not None else "unset"


def _default(field: FieldInfo | None, note: str) -> str:
    """The model's own default when it has one to show, else the note's (a default that follows other keys)."""
    if field is not None and field.is_required():
        return "**required**"
    if field is None or (field.default is None and field.default_factory is None):
        return note or "unset"
    return _plain_default(field)


def rows() -> list[tuple[str, str, str, str]]:
    """(key, default, rule, meaning) for every key a user may set under kimi-cluster:, in NOTES' order."""
    fields = {f.alias or name: f for name, f in Settings.model_fields.items() if name not in _INTERNAL}
    table = []
    for key, (note, meaning) in NOTES.items():
        field = fields.get(key)
        if field is None and key not in SECRET_KEYS:
            raise KeyError(f"{key} is not a setting of the model")
        rule = _rule(field) if field is not None else "secret: set it with `pulumi config set --secret`"
        table.append((key, _default(field, note), rule, meaning))
    return table


def missing_notes() -> list[str]:
    """Keys of the model (and the secrets) that NOTES does not describe."""
    keys = [f.alias or name for name, f in Settings.model_fields.items() if name not in _INTERNAL]
    return [k for k in [*keys, *SECRET_KEYS] if k not in NOTES]


def reference() -> str:
    """The generated part of docs/configuration.md, its markers included."""
    lines = [BEGIN, "", "| key | default | rule | meaning |", "|---|---|---|---|"]
    lines += [f"| `{k}` | {d} | {r} | {m} |" for k, d, r, m in rows()]
    return "\n".join([*lines, "", END])


def with_reference(document: str) -> str:
    """`document` with the text between its markers replaced by today's reference."""
    start, end = document.index(BEGIN), document.index(END) + len(END)
    return document[:start] + reference() + document[end:]
