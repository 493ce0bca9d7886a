"""The engine's compiled-kernel cache as something kept outside the cluster: its key and where it is stored.

Triton, DeepGEMM's JIT, torch inductor and flashinfer compile or tune on first start and keep the result under the
container's /root/.cache (the storage disk's `cache/<engine>`). `pulumi destroy` takes that disk away; with
`kimi-cluster:kernelCache` set, the head packs it after the readiness wait and every node unpacks it before the next
launch with the same key. Pure functions only: the cache-restore and cache-save steps' inputs and value builder are
here too; the node side is kimi_cluster/node/kernel_cache.py (with kernel_files.py and kernel_store.py).

A kernel is only valid for the code that compiled it (the image), the shapes it was compiled for (tensor and expert
parallel size, quantization and MoE runner, context length), the GPU it runs on and the weights' layout (the model
and its revision): each of those is a field of the key, and any change is a miss, never a wrong cache.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from typing import Any

from kimi_cluster.plan import launch
from kimi_cluster.plan.launch import EngineInputs
from kimi_cluster.plan.step_scripts import shipped, shipped_packages
from kimi_cluster.plan.steps.model import VmSpot
from kimi_cluster.settings.timing import PIP_BUDGET_S, Timing

BOTO3_VERSION = "1.44.5"  # the S3 client the kernel-cache program runs with; the project pins the same
KERNEL_CACHE_PROGRAM = ("kimi_cluster/node/kernel_cache.py", "kimi_cluster/node/kernel_files.py",
                        "kimi_cluster/node/kernel_store.py", "kimi_cluster/node/printable.py")

# Engine flags that change which kernels are compiled or how they are tuned. Everything else (ports, names, parsers,
# the rendezvous address, the rank) leaves the kernels alone and so stays out of the key.
KERNEL_FLAGS = frozenset({
    "--tp-size", "--tp", "--tensor-parallel-size", "--ep-size", "--ep", "--enable-expert-parallel",
    "--pipeline-parallel-size", "--pp-size", "--dp-size", "--data-parallel-size", "--enable-dp-attention",
    "--quantization", "--moe-runner-backend", "--moe-a2a-backend", "--kv-cache-dtype", "--dtype",
    "--attention-backend", "--sampling-backend", "--context-length", "--max-model-len", "--compilation-config",
    "--cuda-graph-max-bs", "--cuda-graph-bs", "--disable-cuda-graph", "--enforce-eager", "-O",
    "--speculative-algorithm", "--speculative-num-steps",
    # vLLM's engineLayout: data parallel and decode context parallel change the shapes each rank compiles.
    "-dp", "--decode-context-parallel-size", "-dcp",
    # TokenSpeed's split parallelism and backends (runtime/utils/server_args.py).
    "--attn-tp-size", "--dense-tp-size", "--moe-tp-size", "--mm-encoder-tp-mode", "--moe-backend",
    "--all2all-backend",
})
# Where an archive lives under the configured prefix: <prefix><key>/<file>.
ARCHIVE_NAME = "cache.tar.gz"
MANIFEST_NAME = "manifest.json"
FORMAT_VERSION = 1


@dataclass(frozen=True)
class CacheKey:
    """What the kernels in an archive were compiled for; `id` names the archive in the store."""

    engine: str
    image: str
    gpu: str
    model: str
    model_revision: str
    kernel_flags: tuple[tuple[str, str], ...]

    @property
    def fields(self) -> dict[str, Any]:
        d = asdict(self)
        d["kernel_flags"] = [list(p) for p in self.kernel_flags]
        d["format"] = FORMAT_VERSION
        return d

    @property
    def fields_json(self) -> str:
        return json.dumps(self.fields, sort_keys=True, separators=(",", ":"))

    @property
    def id(self) -> str:
        return hashlib.sha256(self.fields_json.encode()).hexdigest()[:32]


def image_identity(image: str) -> str:
    """The image's digest when it has one (a tag can move to other code), else the reference as written."""
    if "@sha256:" in image:
        return "sha256:" + image.rsplit("@sha256:", 1)[1]
    return image


def kernel_flags(argv: list[Any]) -> tuple[tuple[str, str], ...]:
    """The kernel-shaping flags of an engine argv (items may be (flag, value) pairs), in order, later ones winning."""
    words: list[str] = []
    for item in argv:
        words.extend(str(w) for w in (item if isinstance(item, (tuple, list)) else (item,)))
    found: dict[str, str] = {}
    i = 0
    while i < len(words):
        word = words[i]
        name, eq, inline = word.partition("=")
        if name in KERNEL_FLAGS:
            if eq:
                found[name] = inline
            elif i + 1 < len(words) and not words[i + 1].startswith("--"):
                found[name] = words[i + 1]
                i += 1
            else:
                found[name] = ""  # a switch such as --enforce-eager
        i += 1
    return tuple(sorted(found.items()))


def cache_key(engine: EngineInputs) -> CacheKey:
    """The key of this stack's kernels. Rank 0's argv stands for every rank: ranks of one TP/EP group compile the
    same shapes, so one archive serves them all (the rank-only flags are not kernel flags)."""
    return CacheKey(
        engine=engine.engine_name,
        image=image_identity(engine.container_image),
        gpu=engine.gpu.name,
        model=engine.model,
        model_revision=engine.model_revision,
        kernel_flags=kernel_flags(launch.engine_argv(engine, 0, "<head>")),
    )


@dataclass(frozen=True)
class KernelCacheInputs:
    """The cache-restore and cache-save steps' inputs: the key, where the store is (kimi-cluster:kernelCache's
    values of the same names), and the launch identity a save carries (it saves again after a relaunch)."""

    engine_name: str
    key: CacheKey
    location: str
    bucket: str
    prefix: str
    endpoint_url: str
    region: str
    addressing_style: str
    launch_identity: str


def kernel_cache_values(inputs: KernelCacheInputs, _spot: VmSpot, timing: Timing, deadline_s: int,
                        step: str) -> dict[str, Any]:
    restoring = step == "cache-restore"
    return {
        "engine": inputs.engine_name, "key": inputs.key.id, "key_fields": inputs.key.fields_json,
        "location": inputs.location, "bucket": inputs.bucket, "prefix": inputs.prefix,
        "endpoint_url": inputs.endpoint_url, "region": inputs.region, "addressing_style": inputs.addressing_style,
        "boto3_version": BOTO3_VERSION,
        "ship_files": shipped(KERNEL_CACHE_PROGRAM), "ship_packages": shipped_packages(KERNEL_CACHE_PROGRAM),
        "give_up": "starting cold" if restoring else "WARNING: not saved",
        "timeout_s": timing.kernel_cache_transfer_s(deadline_s), "pip_timeout_s": PIP_BUDGET_S // 2,
        "timeout_key": "restoreTimeoutMinutes" if restoring else "saveTimeoutMinutes",
    }


def save_suffix(inputs: KernelCacheInputs) -> str:
    """What the save's text ends with: the launch identity, so that it runs again after a relaunch."""
    return f"# after launch configuration {inputs.launch_identity}\n"
