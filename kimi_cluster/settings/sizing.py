"""Pure sizing arithmetic: does a checkpoint fit a cluster, which tensor-parallel sizes are valid, what it costs.

Everything here is a function of catalog data; the settings model calls it so that a cluster that cannot hold
the checkpoint is refused before anything is billed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kimi_cluster.settings.catalog import GB, GIB, HUB_BANDWIDTH_GIB_S, GpuSpec, ModelSpec, Price


def valid_tp_sizes(model: ModelSpec) -> list[int]:
    """Tensor parallel must split both the attention heads and the hidden size evenly."""
    g = math.gcd(model.attention_heads, model.hidden_size)
    return [d for d in range(1, g + 1) if g % d == 0]


@dataclass(frozen=True)
class FitReport:
    """The verdict for one cluster shape, with every number the plan prints."""

    fits: bool
    nodes: int
    gpus_per_node: int
    gpu: GpuSpec
    tensor_parallel: int
    tp_valid: bool
    checkpoint_bytes: int
    capacity_bytes: int
    headroom_bytes: int  # negative when short
    weights_per_gpu_bytes: int
    valid_tp: tuple[int, ...]

    @property
    def total_gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def headroom_per_gpu_bytes(self) -> int:
        return self.headroom_bytes // self.total_gpus

    @property
    def shortfall_bytes(self) -> int:
        return max(0, -self.headroom_bytes)

    def summary(self) -> str:
        shape = f"{self.nodes} x {self.gpus_per_node}x {self.gpu.name} ({self.total_gpus} GPUs)"
        cap = f"{fmt_gb(self.capacity_bytes)} usable"
        ckpt = f"checkpoint {fmt_gb(self.checkpoint_bytes)}"
        if not self.tp_valid:
            return (
                f"{shape}: tensor parallel {self.tensor_parallel} does not divide the model's attention heads and "
                f"hidden size; valid sizes are {', '.join(map(str, self.valid_tp))}"
            )
        if not self.fits:
            return f"{shape}: {cap}, {ckpt}: {fmt_gb(self.shortfall_bytes)} short, the model will not load"
        return (
            f"{shape}: {cap}, {ckpt}: fits with {fmt_gb(self.headroom_bytes)} left "
            f"({fmt_gb(self.headroom_per_gpu_bytes)} per GPU) for KV cache, recurrent state, activations and "
            f"communication buffers, before the weights that tensor parallel replicates on every rank"
        )


def check_fit(model: ModelSpec, gpu: GpuSpec, nodes: int, gpus_per_node: int, tensor_parallel: int) -> FitReport:
    """Every expert stays resident, so the whole checkpoint must fit in the cluster's usable GPU memory."""
    total = nodes * gpus_per_node
    valid = tuple(valid_tp_sizes(model))
    capacity = gpu.usable_bytes * total
    headroom = capacity - model.checkpoint_bytes
    per_gpu = model.checkpoint_bytes // max(tensor_parallel, 1)
    tp_valid = tensor_parallel in valid
    return FitReport(
        fits=tp_valid and headroom > 0 and per_gpu < gpu.usable_bytes,
        nodes=nodes,
        gpus_per_node=gpus_per_node,
        gpu=gpu,
        tensor_parallel=tensor_parallel,
        tp_valid=tp_valid,
        checkpoint_bytes=model.checkpoint_bytes,
        capacity_bytes=capacity,
        headroom_bytes=headroom,
        weights_per_gpu_bytes=per_gpu,
        valid_tp=valid,
    )


def hourly_cost_usd(price: Price | None, total_gpus: int) -> float | None:
    """Hyperstack bills per GPU-hour (per minute in practice); None when no price is known."""
    if price is None:
        return None
    return round(price.usd_per_gpu_hour * total_gpus, 2)


def download_minutes(model: ModelSpec) -> tuple[float, float]:
    """Every node pulls the whole checkpoint in parallel, so the weights step takes S / B_hub per node."""
    low, high = HUB_BANDWIDTH_GIB_S
    size_gib = model.checkpoint_bytes / GIB
    return (round(size_gib / high / 60, 1), round(size_gib / low / 60, 1))


def fmt_gb(n: int) -> str:
    """Both units: sellers quote GB, PyTorch and nvidia-smi count GiB."""
    return f"{n / GB:,.2f} GB ({n / GIB:,.1f} GiB)"
