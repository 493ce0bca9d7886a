"""How long the work of a bring-up's phases takes, as the plan models it: the one home of the figures that both the
time to a verified endpoint (kimi_cluster/operator/bringup.py) and the floors of the step deadlines
(kimi_cluster/plan/steps/table.py: a kimi-cluster:stepDeadlineMinutes shorter than its step's own work is refused)
read. Each figure is a (low, high) range with its source; a floor takes the low end, the least that work takes.
"""

from __future__ import annotations

IMAGE_BYTES = 16e9
IMAGE_BYTES_PER_S = (55e6, 90e6)
IMAGE_SOURCE = ("a ~16 GB engine image (Hyperstack's Kimi deployment guide); docker pull decompresses each gzip "
                "layer on one thread, about 3-5 min")
LOAD_S = (160.0, 217.0)
LOAD_SOURCE = ("weights to GPU, 160-217 s reported for a 671B checkpoint on 8 GPUs; 15-45 s with fast loaders: "
               "https://github.com/sgl-project/sglang/pull/7943, https://github.com/sgl-project/sglang/pull/20289")
WARMUP_COLD_S = (600.0, 1200.0)
WARMUP_CACHED_S = (60.0, 180.0)
WARMUP_SOURCE = ("DeepGEMM compiles its kernels just in time on first use (https://github.com/deepseek-ai/DeepGEMM); "
                 "10-20 min cold, under 3 min with the JIT and tuning caches kept: "
                 "https://github.com/sgl-project/sglang/pull/5580, https://github.com/vllm-project/vllm/issues/52330")
READY_S = (30.0, 120.0)
READY_SOURCE = "the engine's /health and /v1/models answer, then the verifier's checks (seconds each)"
# vLLM's render server on the front's CPU: importing vLLM alone takes some 15 CPU-seconds
# (tests/engine_parsers/probe.py), then the model's config and tokenizer come from the hub. Assumed, not measured on a
# front.
RENDER_START_S = (60.0, 180.0)


def image_pull_s() -> float:
    """The least an engine image pull takes: the image at the model's slow rate (docker unpacks on one thread)."""
    return IMAGE_BYTES / IMAGE_BYTES_PER_S[0]


def render_server_s() -> float:
    """The least the front's resume step takes: the engine's image pulled there, then vLLM's render server started."""
    return image_pull_s() + RENDER_START_S[0]


def engine_start_s(warm_caches: bool) -> float:
    """The least an engine takes from its launch to serving: the load to the GPUs, its kernels' warm-up (from kept
    caches, or cold), its first answers."""
    warmup = WARMUP_CACHED_S if warm_caches else WARMUP_COLD_S
    return LOAD_S[0] + warmup[0] + READY_S[0]
