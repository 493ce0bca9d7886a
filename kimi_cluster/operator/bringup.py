"""The time from `pulumi up` to a verified endpoint, modelled phase by phase for a stack's real cluster.

Each phase carries the rate it assumes and where that rate comes from, so a reader can replace a figure with a
measured one (`kimi-cluster timeline` draws what a real bring-up took). The critical path is

    T_endpoint = T_vm + max(T_image, T_weights) + T_check + T_load + T_warmup + T_ready

(a first bring-up with kimi-cluster:kernelWarmup compiles the kernels from the model's shapes beside the download:
max(T_image + T_warmup_from_shapes, T_weights) there, since the warm-up runs in the engine's image, and the cached
T_warmup after the load: docs/warm-up.md)

with the weights either pulled whole by every node (S / B_hub) or split between the nodes and fanned out over the
private network, where the slowest of hub share, disk write and peer traffic decides:
max(S / (N * B_hub), S / B_write, (N - 1) * S / (N * B_net)).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from kimi_cluster.settings import Settings
from kimi_cluster.settings.catalog import GIB

# The phases the step deadlines' floors also read have their one home there.
from kimi_cluster.settings.work_model import (
    IMAGE_BYTES,
    IMAGE_BYTES_PER_S,
    IMAGE_SOURCE,
    LOAD_S,
    LOAD_SOURCE,
    READY_S,
    READY_SOURCE,
    WARMUP_CACHED_S,
    WARMUP_COLD_S,
    WARMUP_SOURCE,
)

# Rates as (low, high) ranges and their public sources.
HUB_BYTES_PER_S = (1.1 * GIB, 1.8 * GIB)
HUB_SOURCE = ("snapshot_download per VM, typical: huggingface_hub PR #2989 "
              "(https://github.com/huggingface/huggingface_hub/pull/2989); hub rate limits: "
              "https://huggingface.co/docs/hub/rate-limits")
# What the hub rate above takes of the hub's CDN, and what the weights program does so that it holds
# (kimi_cluster/node/weights_ranges.py; measured with benchmarks/bench_weights_edges.py, docs/ARCHITECTURE.md).
EDGES_ASSUMED = ("every hub stream on a fast CDN edge (~68 MB/s per connection): a stream below its floor "
                 "(kimi-cluster:hubStreamMinMBps, hubStreamFloorShare) is re-opened on another edge and the last "
                 "files are split into ranges, so the 65-75% of edges capped at 8.7 MB/s (huggingface/xet-core#821) "
                 "cost re-opens, not a whole shard at 8.7 MB/s at the end")
DISK_WRITE_BYTES_PER_S = (3e9, 5e9)
DISK_SOURCE = "local NVMe (/ephemeral) sequential write, assumed 3-5 GB/s; the sharded download is bound by it"
NET_BYTES_PER_S = (43e9, 43e9)
NET_SOURCE = ("Hyperstack network-optimised environments: up to 350 Gbps between VMs "
              "(https://docs.hyperstack.cloud/docs/hardware/flavor-labels)")
VM_S = (180.0, 600.0)
VM_SOURCE = ("assumed: ACTIVE with a floating IP, then sshd and cloud-init; the ready step allows about 10 min of "
             "refused SSH dials (kimi_cluster/deploy/remote_step.py DIAL_ERROR_LIMIT); measure yours with "
             "kimi-cluster timeline")
CHECK_RECORDED_S = (1.0, 10.0)
CHECK_SOURCE = ("stat every file and compare the hashes recorded while it streamed with the hub's manifest "
                "(scripts/check_download.py); no second read of the checkpoint")
WARMUP_FROM_SHAPES_SOURCE = (
    "the same JIT compiles and tuning as the cold warm-up, run from the model's config.json with random weights "
    "(--load-format dummy: SGLang's own python -m sglang.compile_deep_gemm, "
    "https://github.com/sgl-project/sglang/blob/v0.5.23/python/sglang/compile_deep_gemm.py; vLLM's and "
    "TokenSpeed's servers started once: https://docs.vllm.ai/en/latest/configuration/engine_args.html): "
    "DeepGEMM's kernels depend on the shapes, not the values (https://github.com/deepseek-ai/DeepGEMM); it runs in "
    "the engine's image, so it starts once the pull ends; the launch's own warm-up then reads the filled caches")


@dataclass(frozen=True)
class Phase:
    name: str
    low_s: float
    high_s: float
    assumes: str
    source: str
    on_path: bool = True  # False: runs alongside another phase, off the critical path


def _range(size: float, rate: tuple[float, float]) -> tuple[float, float]:
    return size / rate[1], size / rate[0]


def weights_naive_s(checkpoint: int) -> tuple[float, float]:
    return _range(checkpoint, HUB_BYTES_PER_S)


def weights_sharded_s(checkpoint: int, nodes: int) -> tuple[float, float]:
    """max(S / (N * B_hub), S / B_write, (N - 1) * S / (N * B_net)); one node is the hub alone."""
    if nodes < 2:
        return weights_naive_s(checkpoint)
    hub = _range(checkpoint / nodes, HUB_BYTES_PER_S)
    disk = _range(checkpoint, DISK_WRITE_BYTES_PER_S)
    net = _range((nodes - 1) * checkpoint / nodes, NET_BYTES_PER_S)
    return max(hub[0], disk[0], net[0]), max(hub[1], disk[1], net[1])


def download_minutes(settings: Settings) -> list[float]:
    """The weights step as this stack runs it, sharded over its nodes (the bring-up's weights row), in minutes."""
    return [round(x / 60, 1) for x in weights_sharded_s(settings.model_spec.checkpoint_bytes, settings.nodes)]


def phases(settings: Settings, sharded: bool = True, kernel_cache: bool = False,
           warmup_beside: bool = False) -> list[Phase]:
    """The phases of one bring-up of this stack, in order.

    warmup_beside: a first bring-up whose kernels are compiled from the shapes alone while the weights download
    (kimi-cluster:kernelWarmup, docs/warm-up.md); the image row then holds the pull followed by that warm-up, and
    the launch's warm-up finds the caches filled."""
    s = settings.model_spec.checkpoint_bytes
    n = settings.nodes
    gb = f"{s / 1e9:,.0f} GB"
    image = _range(IMAGE_BYTES, IMAGE_BYTES_PER_S)
    if sharded and n > 1:
        w = weights_sharded_s(s, n)
        w_name = f"weights, sharded over {n} nodes"
        w_assumes = (f"{gb} / {n} per node from the hub at 1.1-1.8 GiB/s, the rest from peers; bound by "
                     f"max(hub share, disk write 3-5 GB/s, peer traffic at up to 43 GB/s)")
        w_source = f"{HUB_SOURCE}; {DISK_SOURCE}; {NET_SOURCE}"
    else:
        w = weights_naive_s(s)
        w_name = "weights, every node pulls all" if n > 1 else "weights (one node: all from the hub)"
        w_assumes = f"{gb} per node from the hub at 1.1-1.8 GiB/s"
        w_source = HUB_SOURCE
    image_row = Phase("image pull (alongside the weights)", *image, "16 GB at 55-90 MB/s", IMAGE_SOURCE)
    if warmup_beside and not kernel_cache:
        image = image[0] + WARMUP_COLD_S[0], image[1] + WARMUP_COLD_S[1]
        image_row = Phase("image pull, then kernel warm-up from shapes (alongside the weights)", *image,
                          "16 GB at 55-90 MB/s, then 10-20 min of JIT compiles on random weights",
                          f"{IMAGE_SOURCE}; {WARMUP_FROM_SHAPES_SOURCE}")
        kernel_cache = True  # the launch's warm-up reads what that one compiled
    # Ranges, not points: whichever of the two is longer at the high end is drawn on the path.
    image_first = image[1] > w[1]
    warm = WARMUP_CACHED_S if kernel_cache else WARMUP_COLD_S
    return [
        Phase("VM boot and SSH", *VM_S, "ACTIVE, floating IP, sshd, cloud-init", VM_SOURCE),
        replace(image_row, on_path=image_first),
        Phase(w_name, *w, w_assumes, w_source, on_path=not image_first),
        Phase("check", *CHECK_RECORDED_S, "hashes recorded while streaming, compared with the manifest",
              CHECK_SOURCE),
        Phase("load to GPU", *LOAD_S, "checkpoint from local NVMe to every GPU", LOAD_SOURCE),
        Phase("kernel warm-up, " + ("caches restored" if kernel_cache else "cold"), *warm,
              "JIT compile and tuning " + ("from the kept caches" if kernel_cache else "from scratch"),
              WARMUP_SOURCE),
        Phase("readiness and verification", *READY_S, "health, model list, endpoint checks", READY_SOURCE),
    ]


def total_s(rows: list[Phase]) -> tuple[float, float]:
    on = [p for p in rows if p.on_path]
    return sum(p.low_s for p in on), sum(p.high_s for p in on)


def fmt_minutes(low_s: float, high_s: float) -> str:
    lo, hi = low_s / 60, high_s / 60
    if hi < 1:
        return f"{low_s:.0f}-{high_s:.0f} s"
    return f"{lo:.1f}-{hi:.1f} min"


def scenarios(settings: Settings) -> dict[str, tuple[float, float]]:
    """Totals of the combinations worth comparing: what the pieces of this project each save."""
    out = {"every node pulls all, kernels cold": total_s(phases(settings, sharded=False, kernel_cache=False))}
    if settings.nodes > 1:
        out["sharded weights, kernels cold"] = total_s(phases(settings, sharded=True, kernel_cache=False))
    weights = "sharded weights" if settings.nodes > 1 else "weights"
    out[weights + ", first bring-up, kernels warmed beside the download (kernelWarmup)"] = total_s(
        phases(settings, sharded=True, warmup_beside=True))
    out[weights + ", kernel caches restored"] = total_s(phases(settings, sharded=True, kernel_cache=True))
    return out
