"""A VM made ready for the work (the first steps of every VM): SSH and cloud-init, the GPUs counted and the private
interface found (`ready`), the storage disk under the Hugging Face cache and Docker (`storage`), the images pulled
(`image`), and on the front cloud-init and Docker (`front-ready`). Each step's frozen inputs and value builder.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kimi_cluster.plan.steps.model import VmSpot
from kimi_cluster.settings.timing import Timing


@dataclass(frozen=True)
class ReadyInputs:
    gpus_per_node: int


@dataclass(frozen=True)
class StorageInputs:
    engine_name: str
    checkpoint_bytes: int
    disk_margin_gb: int


@dataclass(frozen=True)
class ImageInputs:
    container_image: str
    proxy_container_image: str
    has_front: bool  # without a front, the head runs the TLS proxy: its image comes down too


@dataclass(frozen=True)
class NoInputs:
    """A step that reads nothing of the settings (its values are the timing's)."""


def ready_values(inputs: ReadyInputs, spot: VmSpot, timing: Timing, _deadline_s: int, _step: str) -> dict[str, Any]:
    return {"private_ip": spot.private_ip, "gpus_per_node": inputs.gpus_per_node,
            "cloud_init_timeout_s": timing.cloud_init_timeout_s, "gpu_timeout_s": timing.gpu_timeout_s}


def storage_values(inputs: StorageInputs, _spot: VmSpot, timing: Timing, _deadline_s: int,
                   _step: str) -> dict[str, Any]:
    ckpt = inputs.checkpoint_bytes
    return {"engine": inputs.engine_name, "need_bytes": ckpt + inputs.disk_margin_gb * 10**9,
            "checkpoint_gb": f"{ckpt / 1e9:,.1f} GB", "margin_gb": f"{inputs.disk_margin_gb} GB",
            "docker_timeout_s": timing.docker_timeout_s}


def image_values(inputs: ImageInputs, spot: VmSpot, timing: Timing, _deadline_s: int, _step: str) -> dict[str, Any]:
    # The head also runs the proxy; its image comes down with the engine's, before the long weight download ends.
    serves_api = spot.rank == 0 and not inputs.has_front
    images = [inputs.container_image] + ([inputs.proxy_container_image] if serves_api else [])
    return {"images": images, "pull_attempts": timing.pull_attempts, "pull_timeout_s": timing.pull_timeout_s,
            "pull_backoff_s": timing.pull_backoff_s}


def front_ready_values(_inputs: NoInputs, _spot: VmSpot, timing: Timing, _deadline_s: int,
                       _step: str) -> dict[str, Any]:
    return {"cloud_init_timeout_s": timing.cloud_init_timeout_s, "docker_timeout_s": timing.docker_timeout_s}
