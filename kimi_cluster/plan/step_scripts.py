"""The steps' value builders (pure): what each step's template (kimi_cluster/plan/templates/<step>.sh.j2) gets.

Each builder is named by its step's entry in the step table (kimi_cluster/plan/steps/table.py), and
kimi_cluster/plan/steps/render.py adds the values every step shares (`common_values`). What differs between nodes
(addresses, peers, the TLS certificate) travels in one `NodeSpot`, built by keyword; nothing here makes a Pulumi
resource, and no secret is ever a template value.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kimi_cluster.node import weights
from kimi_cluster.plan import caretaker, front_config, kernel_cache_key, launch, proxy, resume, warmup
from kimi_cluster.plan.front_tuning import DEFAULT_TUNING
from kimi_cluster.plan.render import ShellExpr, Verbatim
from kimi_cluster.settings import RESUME_PORT, WARMUP_ENGINE_PORT, Settings
from kimi_cluster.settings.timing import PIP_BUDGET_S, Timing

HF_HUB_VERSION = "2.4.0"  # the node runs the same huggingface_hub the project pins
WEIGHTS_UNIT = "kimi-weights"
BOTO3_VERSION = "1.44.5"  # the S3 client the kernel-cache program runs with; the project pins the same
_ROOT = Path(__file__).resolve().parents[2]
CHECK_SOURCE = _ROOT / "kimi_cluster" / "node" / "check_download.py"
NAMES_SOURCE = _ROOT / "kimi_cluster" / "node" / "hub_names.py"  # the manifest's name rules, shipped beside the check
# The node programs made of several modules, each shipped with what it imports, at their paths in this repository.
WEIGHTS_PROGRAM = ("kimi_cluster/node/fetch_weights.py", "kimi_cluster/node/weights_files.py",
                   "kimi_cluster/node/weights_peers.py", "kimi_cluster/node/weights_ranges.py",
                   "kimi_cluster/node/weights_transfer.py", "kimi_cluster/node/weights.py",
                   "kimi_cluster/node/hub_names.py")
KERNEL_CACHE_PROGRAM = ("kimi_cluster/node/kernel_cache.py", "kimi_cluster/node/kernel_files.py",
                        "kimi_cluster/node/kernel_store.py", "kimi_cluster/node/printable.py")
PRINTABLE_SOURCE = _ROOT / "kimi_cluster" / "node" / "printable.py"  # status's escape, for what engines print
CARETAKER_SOURCE = _ROOT / "kimi_cluster" / "node" / "caretaker.py"
# The billing history's reading and the caretaker's Hyperstack calls, shipped beside it.
SPEND_SOURCE = _ROOT / "kimi_cluster" / "node" / "caretaker_spend.py"
CARETAKER_API_SOURCE = _ROOT / "kimi_cluster" / "node" / "caretaker_api.py"


@dataclass(frozen=True)
class ProxyTls:
    """The public half of the endpoint's TLS material: the server certificate chain and the CA clients trust."""

    cert_chain_pem: str
    ca_pem: str


# What the offline plan and the tests render when no certificate exists yet.
PLAN_TLS = ProxyTls("<the server certificate chain, made at deploy time>\n", "<the stack's CA certificate>\n")
PLAN_PUBLIC_IP = "<head-public-ip>"


@dataclass(frozen=True)
class NodeSpot:
    """Where one node stands: what its scripts know of addresses, peers and the endpoint's certificate.

    `peer_ips` (every node's private address, in fan-out order) makes the weights step share the download; without
    them the node downloads every file from the hub. `peer_rank` is this node's place among them (behind a front the
    fan-out spans every replica), else its rank. `container` and `identity` are the readiness wait's, on the front;
    `front_upstreams` makes the proxy step the front's, load-balancing over those replica heads.
    """

    rank: int = 0
    private_ip: str = ""
    head_private_ip: str = ""
    tls: ProxyTls = PLAN_TLS
    public_ip: str = PLAN_PUBLIC_IP
    peer_ips: Sequence[str] | None = None
    peer_rank: int | None = None
    container: str | None = None
    identity: str | None = None
    front_upstreams: Sequence[str] | None = None  # the front's proxy: every replica head's private address


# ---- what the steps share ------------------------------------------------------------------------------------------


def storage_path(settings: Settings) -> str:
    path = "/" + settings.storage_path.strip("/")
    return path if path != "/" else ""


def _repo_folder(settings: Settings) -> str:
    return "models--" + settings.model.replace("/", "--")


def _source(path: Path) -> Verbatim:
    """A program of this repository, as the body of a quoted heredoc (its delimiter never appears in it)."""
    text = path.read_text(encoding="utf-8")
    return Verbatim(text if text.endswith("\n") else text + "\n")


@dataclass(frozen=True)
class ShippedFile:
    """A file of this repository a node program needs: where it lands under the program's folder (its path here),
    its bytes, and the quoted heredoc's delimiter that carries them (kimi_cluster/plan/templates/_ship.sh.j2)."""

    path: str
    body: Verbatim
    delimiter: str

    @property
    def packed(self) -> str:
        """Its bytes gzipped (no timestamp: the same file packs the same) in base64, for a step whose text would
        pass the 128 KiB a single argument may hold (Linux's MAX_ARG_STRLEN: the step travels as one, in base64)."""
        return base64.b64encode(gzip.compress(str(self.body).encode(), mtime=0)).decode()


def shipped(paths: Sequence[str]) -> list[ShippedFile]:
    """The files a node program is made of, laid out as in this repository, so that `python -m kimi_cluster.node.X`
    imports its siblings on the node as it does in the tests."""
    out = []
    for path in paths:
        body = _source(_ROOT / path)
        delimiter = "KIMI_" + "".join(c if c.isalnum() else "_" for c in path.upper())
        if delimiter in body:
            raise ValueError(f"{path} contains its own heredoc delimiter {delimiter}")
        out.append(ShippedFile(path, body, delimiter))
    return out


def shipped_packages(paths: Sequence[str]) -> list[str]:
    """The package folders the shipped files sit in; each gets an empty __init__.py on the node, so no package's
    own imports run there."""
    folders: set[str] = set()
    for path in paths:
        parts = path.split("/")[:-1]
        folders.update("/".join(parts[:i]) for i in range(1, len(parts) + 1))
    return sorted(folders)


def common_values(settings: Settings, rank: int, step: str, summary: str, timing: Timing) -> dict[str, Any]:
    """What every step's template gets: its name and summary, the node's rank and roots, the poll intervals."""
    return {
        "step": step,
        "summary": Verbatim(summary),  # a comment line
        "rank": rank,
        "node_root": settings.node_root,
        "storage_path": storage_path(settings),
        "poll_seconds": timing.poll_seconds,
        "fast_poll_seconds": timing.fast_poll_seconds,
        "printable_source": _source(PRINTABLE_SOURCE),  # for the steps that include _printable.sh.j2
    }


def serves_api(settings: Settings, rank: int) -> bool:
    """Whether this node runs the TLS proxy: the head, unless a front (replicas >= 2) holds the endpoint."""
    return rank == 0 and not settings.has_front


def settings_key(key: str) -> str:
    return f"kimi-cluster:{key}"


def readiness_identity(settings: Settings, tls: ProxyTls = PLAN_TLS) -> str:
    """Changes whenever any rank's launch configuration or the proxy's does, so the readiness wait runs again after a
    relaunch."""
    prints = [launch.launch_fingerprint(settings, r, f"<node{r}>", "<node0>") for r in range(settings.nodes)]
    prints.append(proxy.proxy_fingerprint(settings, tls.cert_chain_pem, tls.ca_pem))
    return hashlib.sha256(" ".join(prints).encode()).hexdigest()[:16]


def fan_out_size(settings: Settings) -> int:
    """How many nodes share one download: the replica's, or behind a front every GPU node of every replica (a
    re-created replica then fetches from its twin's disks, and a first bring-up takes each file from the hub once)."""
    return settings.nodes * settings.replicas if settings.has_front else settings.nodes


def peer_list(settings: Settings, peer_ips: Sequence[str] | None) -> str:
    """Every node's private address and peer port, in rank order; empty when this node fetches alone."""
    if fan_out_size(settings) < 2 or not peer_ips:
        return ""
    if len(peer_ips) != fan_out_size(settings):
        raise ValueError(f"{len(peer_ips)} peer addresses for {fan_out_size(settings)} nodes")
    return ",".join(f"{ip}:{settings.peer_port}" for ip in peer_ips)


# ---- one value builder per step ------------------------------------------------------------------------------------

def ready_values(settings: Settings, _step: str, spot: NodeSpot, timing: Timing, _deadline_s: int) -> dict[str, Any]:
    return {"private_ip": spot.private_ip, "gpus_per_node": settings.gpus_per_node_count,
            "cloud_init_timeout_s": timing.cloud_init_timeout_s, "gpu_timeout_s": timing.gpu_timeout_s}


def storage_values(settings: Settings, _step: str, _spot: NodeSpot, timing: Timing, _deadline_s: int) -> dict[str, Any]:
    ckpt = settings.model_spec.checkpoint_bytes
    return {"engine": settings.engine_name, "need_bytes": ckpt + settings.disk_margin_gb * 10**9,
            "checkpoint_gb": f"{ckpt / 1e9:,.1f} GB", "margin_gb": f"{settings.disk_margin_gb} GB",
            "docker_timeout_s": timing.docker_timeout_s}


def image_values(settings: Settings, _step: str, spot: NodeSpot, timing: Timing, _deadline_s: int) -> dict[str, Any]:
    # The head also runs the proxy; its image comes down with the engine's, before the long weight download ends.
    images = [settings.container_image] + ([settings.proxy_container_image] if serves_api(settings, spot.rank) else [])
    return {"images": images, "pull_attempts": timing.pull_attempts, "pull_timeout_s": timing.pull_timeout_s,
            "pull_backoff_s": timing.pull_backoff_s}


def weights_values(settings: Settings, _step: str, spot: NodeSpot, timing: Timing, _deadline_s: int) -> dict[str, Any]:
    return {"repo": settings.model, "revision": settings.model_revision, "unit": WEIGHTS_UNIT,
            "repo_folder": _repo_folder(settings), "checkpoint_bytes": settings.model_spec.checkpoint_bytes,
            "hf_hub_version": HF_HUB_VERSION, "download_workers": settings.download_workers,
            "hf_endpoint": settings.hf_endpoint, "download_timeout_s": timing.download_s(settings),
            "peers": peer_list(settings, spot.peer_ips),
            "peer_rank": spot.rank if spot.peer_rank is None else spot.peer_rank,
            "serve_complete": settings.has_front, "peer_timeout_s": timing.peer_timeout_s,
            "stall_seconds": timing.stall_seconds, "progress_file": weights.PROGRESS_FILE,
            "hub_min_rate": f"{settings.hub_stream_min_mbps * 1e6:.0f}",
            "hub_floor_share": f"{settings.hub_stream_floor_share:g}",
            "hub_window": f"{settings.hub_stream_window_seconds:g}",
            "verified_dir": weights.VERIFIED_DIR, "ship_files": shipped(WEIGHTS_PROGRAM),
            # Gzipped: with the range fetcher, the program as heredocs passed the 128 KiB one argument holds.
            "ship_packages": shipped_packages(WEIGHTS_PROGRAM), "ship_packed": True}


def check_values(settings: Settings, _step: str, _spot: NodeSpot, _timing: Timing, _deadline_s: int) -> dict[str, Any]:
    return {"repo": settings.model, "revision": settings.model_revision, "hf_endpoint": settings.hf_endpoint,
            "verify_sha256": settings.verify_sha256, "check_source": _source(CHECK_SOURCE),
            "names_source": _source(NAMES_SOURCE), "verified_dir": weights.VERIFIED_DIR}


def _engine_values(settings: Settings, spot: NodeSpot) -> dict[str, Any]:
    """What the launch and the kernel warm-up both get: the engine's container, its node and its snapshot."""
    return {"private_ip": spot.private_ip, "engine": settings.engine_name, "nodes": settings.nodes,
            "repo_folder": _repo_folder(settings), "revision": settings.model_revision,
            "needs_nic": settings.engine_name == "sglang" and settings.nodes > 1,
            "gpus_per_node": settings.gpus_per_node_count, "cache_mode": launch.cache_dir_mode(settings),
            "engine_container": launch.CONTAINER_NAME, "warmup_container": warmup.CONTAINER_NAME,
            "warmup_result": warmup.RESULT_FILE}


def launch_values(settings: Settings, _step: str, spot: NodeSpot, timing: Timing, _deadline_s: int) -> dict[str, Any]:
    argv = launch.docker_run_argv(settings, spot.rank, private_ip=spot.private_ip,
                                  head_private_ip=spot.head_private_ip, hf_dir=ShellExpr("${HF}"),
                                  cache_dir=ShellExpr("${CACHE}"))
    return {**_engine_values(settings, spot), "container": launch.CONTAINER_NAME,
            "fingerprint": launch.launch_fingerprint(settings, spot.rank, spot.private_ip, spot.head_private_ip),
            "fingerprint_label": launch.FINGERPRINT_LABEL, "docker_argv": argv,
            "settle_seconds": timing.settle_seconds, "warmup": settings.kernel_warmup}


def warmup_values(settings: Settings, _step: str, spot: NodeSpot, timing: Timing, deadline_s: int) -> dict[str, Any]:
    # The warm-up gives up (and the launch starts cold) before its step's deadline, stepDeadlineMinutes.warmup
    # included, could stop it: a stopped step would fail `pulumi up`, which the warm-up must never do.
    timeout_s = max(1, min(timing.warmup_timeout_s, deadline_s - timing.docker_timeout_s))
    argv = warmup.docker_run_argv(settings, spot.rank, private_ip=spot.private_ip,
                                  head_private_ip=spot.head_private_ip, hf_dir=ShellExpr("${HF}"),
                                  cache_dir=ShellExpr("${CACHE}"), timeout_s=timeout_s)
    # A chat request: the route all three engines' OpenAI servers answer.
    request = {"model": settings.served_name, "messages": [{"role": "user", "content": "warm-up"}], "max_tokens": 8}
    return {**_engine_values(settings, spot), "docker_argv": argv, "request_body": json.dumps(request),
            "exits_by_itself": warmup.exits_by_itself(settings), "timeout_s": timeout_s,
            "engine_url": f"http://{launch.ENGINE_HOST}:{WARMUP_ENGINE_PORT}", "progress_file": weights.PROGRESS_FILE,
            "verified_dir": weights.VERIFIED_DIR, "log_tail": timing.log_tail,
            # What the cache-restore step records once it restored this configuration's kernels.
            "cache_key": kernel_cache_key.cache_key(settings).id if settings.kernel_cache is not None else ""}


def kernel_cache_values(settings: Settings, step: str, _spot: NodeSpot, timing: Timing,
                        deadline_s: int) -> dict[str, Any]:
    cfg = settings.kernel_cache
    if cfg is None:
        raise ValueError(f"step {step} needs {settings_key('kernelCache')} to be set")
    key = kernel_cache_key.cache_key(settings)
    restoring = step == "cache-restore"
    return {
        "engine": settings.engine_name, "key": key.id, "key_fields": key.fields_json, "location": cfg.location,
        "bucket": cfg.bucket, "prefix": cfg.prefix, "endpoint_url": cfg.endpoint_url or "", "region": cfg.region,
        "addressing_style": cfg.addressing_style, "boto3_version": BOTO3_VERSION,
        "ship_files": shipped(KERNEL_CACHE_PROGRAM), "ship_packages": shipped_packages(KERNEL_CACHE_PROGRAM),
        "give_up": "starting cold" if restoring else "WARNING: not saved",
        "timeout_s": timing.kernel_cache_transfer_s(deadline_s), "pip_timeout_s": PIP_BUDGET_S // 2,
        "timeout_key": "restoreTimeoutMinutes" if restoring else "saveTimeoutMinutes",
    }


def proxy_values(settings: Settings, _step: str, spot: NodeSpot, timing: Timing, _deadline_s: int) -> dict[str, Any]:
    heads = spot.front_upstreams
    if heads is None:  # the head's own proxy, in front of its engine
        return proxy.step_values(settings, spot.tls.cert_chain_pem, spot.tls.ca_pem, proxy.render_config(settings),
                                 proxy.upstream(settings), timing.proxy_settle_seconds)
    # The front's (replicas >= 2): load-balancing over every replica's engine, reloaded through its admin socket.
    return proxy.step_values(settings, spot.tls.cert_chain_pem, spot.tls.ca_pem,
                             front_config.caddyfile(settings, heads),
                             " ".join(front_config.upstreams(settings, heads)), timing.proxy_settle_seconds,
                             admin=True)


def front_ready_values(_settings: Settings, _step: str, _spot: NodeSpot, timing: Timing,
                       _deadline_s: int) -> dict[str, Any]:
    return {"cloud_init_timeout_s": timing.cloud_init_timeout_s, "docker_timeout_s": timing.docker_timeout_s}


def resume_values(settings: Settings, _step: str, spot: NodeSpot, timing: Timing, _deadline_s: int) -> dict[str, Any]:
    """The front's resuming layer (resumeStreams): vLLM's render server in the engine's image, then the program."""
    heads = list(spot.front_upstreams or [f"<replica {r} head>" for r in range(settings.replicas)])
    argv, files = resume.resumer_argv(), shipped(resume.PROGRAM)
    return {"render_slots": resume.RENDER_SLOTS, "units": resume.UNITS, "image": settings.container_image,
            "fingerprint": resume.render_fingerprint(settings), "fingerprint_label": resume.FINGERPRINT_LABEL,
            "docker_argv": resume.render_docker_argv(settings, ShellExpr("${RENDER_ENV}"), ShellExpr("${RENDER_HF}")),
            "loopback": resume.LOOPBACK, "resume_address": resume.resume_address(),
            "resumer_argv": argv, "replica_urls": resume.replica_urls(heads, settings),
            "replicas_file": resume.REPLICAS_FILE,
            "resumer_fingerprint": resume.resumer_fingerprint(argv, [(f.path, f.body) for f in files]),
            "pull_attempts": timing.pull_attempts, "pull_timeout_s": timing.pull_timeout_s,
            "pull_backoff_s": timing.pull_backoff_s, "render_timeout_s": timing.proxy_timeout_s,
            "resume_timeout_s": timing.proxy_timeout_s, "log_tail": timing.log_tail,
            "resume_port": RESUME_PORT, "stop_timeout_s": resume.stop_timeout_s(), "port_poll_s": resume.PORT_POLL_S,
            "ship_files": files, "ship_packages": shipped_packages(resume.PROGRAM), "ship_packed": True}


def readiness_values(settings: Settings, _step: str, spot: NodeSpot, timing: Timing,
                     _deadline_s: int) -> dict[str, Any]:
    # On the front (replicas >= 2) the container it watches is the proxy itself: no engine runs there; its identity
    # runs the wait again when a launch or a replica's address changes.
    front = spot.front_upstreams is not None
    container = proxy.CONTAINER_NAME if front else spot.container or launch.CONTAINER_NAME
    identity = front_identity(settings, spot.front_upstreams or ()) if front else spot.identity
    role = "proxy" if container == proxy.CONTAINER_NAME else "engine"
    return {"container": container, "container_role": role,
            "served_name": settings.served_name, "api_port": settings.api_port,
            "readiness_timeout_s": timing.readiness_s(settings), "log_tail": timing.log_tail,
            # The name clients dial: the certificate is checked for it (curl connects to the head's loopback).
            "public_host": settings.api_hostname or spot.public_ip, "ca_file": proxy.CA_FILE,
            "launch_identity": identity or readiness_identity(settings, spot.tls)}


def engine_ready_values(settings: Settings, _step: str, spot: NodeSpot, timing: Timing,
                        _deadline_s: int) -> dict[str, Any]:
    return {"container": launch.CONTAINER_NAME, "served_name": settings.served_name,
            "engine_url": f"http://{spot.head_private_ip}:{settings.engine_port}",
            "readiness_timeout_s": timing.readiness_s(settings), "log_tail": timing.log_tail,
            "launch_identity": readiness_identity(settings, spot.tls),
            "readmit_checks": DEFAULT_TUNING.readmit_checks, "readmit_interval_s": DEFAULT_TUNING.health_interval_s}


def caretaker_values(settings: Settings, _step: str, spot: NodeSpot, _timing: Timing,
                     _deadline_s: int) -> dict[str, Any]:
    # spot.identity: the GPU VMs' ids, so that the step arms the caretaker again when an up re-creates one.
    guards = [f"idle stop after {settings.idle_stop_minutes} min" if settings.idle_stop_minutes else "",
              f"budget {settings.budget_usd:,.2f} USD" if settings.budget_usd else ""]
    return {"unit": caretaker.UNIT, "state_dir": caretaker.STATE_DIR, "state_file": caretaker.STATE_FILE,
            "key_file": caretaker.KEY_FILE, "caretaker_dir": proxy.CARETAKER_DIR, "ca_file": proxy.CA_FILE,
            "config_b64": base64.b64encode(caretaker.config_json(settings).encode()).decode(),
            "restart_seconds": caretaker.RESTART_SECONDS, "gpu_vm_ids": spot.identity or "<the GPU VMs' ids>",
            "guards": ", ".join(g for g in guards if g), "program_source": _source(CARETAKER_SOURCE),
            "spend_source": _source(SPEND_SOURCE), "api_source": _source(CARETAKER_API_SOURCE)}


def front_identity(settings: Settings, head_private_ips: Sequence[str]) -> str:
    """The front's readiness identity: runs its wait again when a launch or a replica's address changes."""
    return readiness_identity(settings) + "-" + hashlib.sha256(" ".join(head_private_ips).encode()).hexdigest()[:16]
