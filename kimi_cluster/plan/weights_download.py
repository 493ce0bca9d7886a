"""The weights download and its check, plan side: the frozen inputs and value builders of the `weights` step (this
node's share of the pinned checkpoint from the hub, the rest from its peers, in a systemd unit) and the `check`
step (the local snapshot against the hub's manifest). Their node side: kimi_cluster/node/fetch_weights.py and its
weights_* modules, kimi_cluster/node/check_download.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kimi_cluster.node import weights
from kimi_cluster.plan.step_scripts import _ROOT, repo_folder, shipped, shipped_packages, source
from kimi_cluster.plan.steps.model import VmSpot
from kimi_cluster.settings.timing import Timing

HF_HUB_VERSION = "2.4.0"  # the node runs the same huggingface_hub the project pins
WEIGHTS_UNIT = "kimi-weights"
CHECK_SOURCE = _ROOT / "kimi_cluster" / "node" / "check_download.py"
NAMES_SOURCE = _ROOT / "kimi_cluster" / "node" / "hub_names.py"  # the manifest's name rules, shipped beside the check
# The download, shipped with what it imports, at its paths in this repository.
WEIGHTS_PROGRAM = ("kimi_cluster/node/fetch_weights.py", "kimi_cluster/node/weights_files.py",
                   "kimi_cluster/node/weights_peers.py", "kimi_cluster/node/weights_ranges.py",
                   "kimi_cluster/node/weights_transfer.py", "kimi_cluster/node/weights.py",
                   "kimi_cluster/node/hub_names.py")


@dataclass(frozen=True)
class WeightsInputs:
    """The settings' values of the same names, and `fan_out`: how many nodes share one download."""

    model: str
    model_revision: str
    checkpoint_bytes: int
    download_workers: int
    hf_endpoint: str
    fan_out: int
    peer_port: int
    hub_stream_min_mbps: float
    hub_stream_floor_share: float
    hub_stream_window_seconds: float


@dataclass(frozen=True)
class CheckInputs:
    model: str
    model_revision: str
    hf_endpoint: str
    verify_sha256: bool


def peer_list(inputs: WeightsInputs, peer_ips: Sequence[str] | None) -> str:
    """Every node's private address and peer port, in rank order; empty when this node fetches alone."""
    if inputs.fan_out < 2 or not peer_ips:
        return ""
    if len(peer_ips) != inputs.fan_out:
        raise ValueError(f"{len(peer_ips)} peer addresses for {inputs.fan_out} nodes")
    return ",".join(f"{ip}:{inputs.peer_port}" for ip in peer_ips)


def wait_timeout_s(timing: Timing, sharing: bool) -> int:
    """How long the step follows its download: the download's own time, plus, when the nodes share it, the
    --peer-timeout a node may wait for a peer's first answer before it takes that peer's share from the hub."""
    return timing.download_s + (timing.peer_timeout_s if sharing else 0)


def weights_deadline_s(timing: Timing) -> int:
    """The step's deadline: its longest wait (wait_timeout_s with peers) and the slack of installing pip and
    huggingface_hub, shipping the program and printing the log, never less than six slacks."""
    return timing.download_s + max(6 * timing.deadline_slack_s, timing.peer_timeout_s + 5 * timing.deadline_slack_s)


def weights_values(inputs: WeightsInputs, spot: VmSpot, timing: Timing, _deadline_s: int,
                   _step: str) -> dict[str, Any]:
    peers = peer_list(inputs, spot.peer_ips)
    return {"repo": inputs.model, "revision": inputs.model_revision, "unit": WEIGHTS_UNIT,
            "repo_folder": repo_folder(inputs.model), "checkpoint_bytes": inputs.checkpoint_bytes,
            "hf_hub_version": HF_HUB_VERSION, "download_workers": inputs.download_workers,
            "hf_endpoint": inputs.hf_endpoint,
            "peers": peers,
            "peer_rank": spot.rank if spot.peer_rank is None else spot.peer_rank,
            # A node that holds every file still serves them when its step runs again: it runs again when a VM of
            # its group is new (`group_vm_ids`), and that node then takes every file from its peers, not the hub.
            "serve_complete": bool(peers), "group_vm_ids": spot.group_vm_ids or "",
            "peer_timeout_s": timing.peer_timeout_s, "wait_timeout_s": wait_timeout_s(timing, bool(peers)),
            "stall_seconds": timing.stall_seconds, "progress_file": weights.PROGRESS_FILE,
            "hub_min_rate": f"{inputs.hub_stream_min_mbps * 1e6:.0f}",
            "hub_floor_share": f"{inputs.hub_stream_floor_share:g}",
            "hub_window": f"{inputs.hub_stream_window_seconds:g}",
            "verified_dir": weights.VERIFIED_DIR, "ship_files": shipped(WEIGHTS_PROGRAM),
            # Gzipped: with the range fetcher, the program as heredocs passed the 128 KiB one argument holds.
            "ship_packages": shipped_packages(WEIGHTS_PROGRAM), "ship_packed": True}


def check_values(inputs: CheckInputs, _spot: VmSpot, _timing: Timing, _deadline_s: int,
                 _step: str) -> dict[str, Any]:
    return {"repo": inputs.model, "revision": inputs.model_revision, "hf_endpoint": inputs.hf_endpoint,
            "verify_sha256": inputs.verify_sha256, "check_source": source(CHECK_SOURCE),
            "names_source": source(NAMES_SOURCE), "verified_dir": weights.VERIFIED_DIR}
