"""The engine's two steps on a GPU node, plan side: the kernel warm-up (`warmup`, kimi-cluster:kernelWarmup) and the
launch (`launch`). Their inputs and value builders; their command lines are launch.py's and warmup.py's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from kimi_cluster.node import weights
from kimi_cluster.plan import launch, warmup
from kimi_cluster.plan.jinja import ShellExpr
from kimi_cluster.plan.launch import EngineInputs
from kimi_cluster.plan.step_scripts import repo_folder
from kimi_cluster.plan.steps.model import VmSpot
from kimi_cluster.settings import WARMUP_ENGINE_PORT
from kimi_cluster.settings.timing import Timing

# On a node of a multi-node engine: the group its running engine was launched for (templates/launch.sh.j2).
GROUP_FILE = "engine.group"


@dataclass(frozen=True)
class LaunchInputs:
    engine: EngineInputs
    gpus_per_node: int
    warmup: bool  # kernelWarmup: the launch reports what the warm-up left


@dataclass(frozen=True)
class WarmupInputs:
    engine: EngineInputs
    gpus_per_node: int
    cache_key_id: str  # what the cache-restore step records once it restored these kernels; "" without kernelCache


def _engine_values(engine: EngineInputs, gpus_per_node: int, spot: VmSpot) -> dict[str, Any]:
    """What the launch and the kernel warm-up both get: the engine's container, its node and its snapshot."""
    return {"private_ip": spot.private_ip, "engine": engine.engine_name, "nodes": engine.nodes,
            "repo_folder": repo_folder(engine.model), "revision": engine.model_revision,
            "needs_nic": engine.engine_name == "sglang" and engine.nodes > 1,
            "gpus_per_node": gpus_per_node, "cache_mode": launch.cache_dir_mode(engine),
            "engine_container": launch.CONTAINER_NAME, "warmup_container": warmup.CONTAINER_NAME,
            "warmup_result": warmup.RESULT_FILE}


def launch_values(inputs: LaunchInputs, spot: VmSpot, timing: Timing, _deadline_s: int,
                  _step: str) -> dict[str, Any]:
    engine = inputs.engine
    argv = launch.docker_run_argv(engine, spot.rank, private_ip=spot.private_ip,
                                  head_private_ip=spot.head_private_ip, hf_dir=ShellExpr("${HF}"),
                                  cache_dir=ShellExpr("${CACHE}"))
    return {**_engine_values(engine, inputs.gpus_per_node, spot), "container": launch.CONTAINER_NAME,
            "fingerprint": launch.launch_fingerprint(engine, spot.rank, spot.private_ip, spot.head_private_ip),
            "fingerprint_label": launch.FINGERPRINT_LABEL, "docker_argv": argv,
            "settle_seconds": timing.settle_seconds, "warmup": inputs.warmup,
            # Several nodes make one process group, which a rank cannot rejoin: a new VM in it relaunches every rank.
            "group_vm_ids": (spot.group_vm_ids or "") if engine.nodes > 1 else "",
            "group_file": GROUP_FILE}


def warmup_values(inputs: WarmupInputs, spot: VmSpot, timing: Timing, deadline_s: int,
                  _step: str) -> dict[str, Any]:
    engine = inputs.engine
    # The warm-up gives up (and the launch starts cold) before its step's deadline, stepDeadlineMinutes.warmup
    # included, could stop it: a stopped step would fail `pulumi up`, which the warm-up must never do.
    timeout_s = max(1, min(timing.warmup_timeout_s, deadline_s - timing.docker_timeout_s))
    argv = warmup.docker_run_argv(engine, spot.rank, private_ip=spot.private_ip,
                                  head_private_ip=spot.head_private_ip, hf_dir=ShellExpr("${HF}"),
                                  cache_dir=ShellExpr("${CACHE}"), timeout_s=timeout_s)
    # A chat request: the route all three engines' OpenAI servers answer.
    request = {"model": engine.served_name, "messages": [{"role": "user", "content": "warm-up"}], "max_tokens": 8}
    return {**_engine_values(engine, inputs.gpus_per_node, spot), "docker_argv": argv,
            "request_body": json.dumps(request), "exits_by_itself": warmup.exits_by_itself(engine),
            "timeout_s": timeout_s, "engine_url": f"http://{launch.ENGINE_HOST}:{WARMUP_ENGINE_PORT}",
            "progress_file": weights.PROGRESS_FILE, "verified_dir": weights.VERIFIED_DIR, "log_tail": timing.log_tail,
            "cache_key": inputs.cache_key_id}
