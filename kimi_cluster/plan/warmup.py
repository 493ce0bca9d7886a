"""The kernel warm-up (kimi-cluster:kernelWarmup): the engine's JIT kernels compiled from the model's shapes alone,
on random weights, while the real weights still download; the launch then finds its caches filled.

The kernels depend on the model's shapes, the parallel layout and the GPU, not on the weights' values, so the same
`docker run` as the launch's (same image, mounts, cache folders, environment and flags) with `--load-format dummy`
fills the caches the launch reads. What each pinned engine offers, read from its source:

- SGLang 0.5.23 ships `python -m sglang.compile_deep_gemm`, which takes the server's own flags plus `--timeout`,
  starts the server, sends one request and exits once DeepGEMM's kernels are built; on several nodes every rank
  runs it and the ranks above 0 exit when rank 0 does (sglang/compile_deep_gemm.py). It has no offline mode of its
  own: with `--load-format dummy` (a LoadFormat of ServerArgs) it needs only config.json and the tokenizer. Chosen
  for SGLang: it is the engine's own tool for this, it also forces the DeepGEMM shapes a plain start may skip, and
  it ends by itself on every rank.
- vLLM 0.33.0 and TokenSpeed 0.1.1 have no such tool: the engine is served once with `--load-format dummy` (both
  parsers take it) on a loopback port of its own, compiles and captures at start-up, answers one request, and is
  removed. vLLM's torch.compile cache key leaves the load format out (`LoadConfig.compute_hash` has no factors,
  vllm/config/load.py), so the launch hits what the dummy run compiled.

Both dummy loaders refuse a model-loader extra config (vLLM's and TokenSpeed's DummyModelLoader), so SGLang's
loader-threads JSON stays with the real launch. The warm-up's ports are its own (settings/rules.py): a rank whose
warm-up outlives the group's must never join the real launch's rendezvous, and the head's proxy, which forwards to
enginePort, must never reach an engine serving random weights.
"""

from __future__ import annotations

from kimi_cluster.plan import launch
from kimi_cluster.plan.jinja import shell_words
from kimi_cluster.plan.launch import EngineInputs, Item, Word
from kimi_cluster.settings import WARMUP_DIST_INIT_PORT, WARMUP_ENGINE_PORT, catalog

CONTAINER_NAME = "kimi-warmup"
# What the step leaves for the launch to report: one line, "<outcome> <why>" (done, skipped, started or failed).
RESULT_FILE = "warmup.result"
# SGLang's tool: the server's own flags, then its --timeout (CompileArgs in sglang/compile_deep_gemm.py).
SGLANG_COMPILE_TOOL = ("python3", "-m", "sglang.compile_deep_gemm")


def exits_by_itself(engine: EngineInputs) -> bool:
    """Whether the warm-up's container ends on its own when it is done (SGLang's tool), else it is served once and
    removed by the step."""
    return engine.engine_name == "sglang"


def engine_argv(engine: EngineInputs, rank: int, head_private_ip: str, timeout_s: int) -> list[Item]:
    """The warm-up's engine command line: the launch's, on random weights, on the warm-up's own ports."""
    # On the node's loopback, on the warm-up's own port (TokenSpeed's launcher takes the next two).
    replace = {"--host": launch.ENGINE_HOST, "--port": str(WARMUP_ENGINE_PORT),
               "--dist-init-addr": f"{head_private_ip}:{WARMUP_DIST_INIT_PORT}",
               "--prometheus-host": launch.ENGINE_HOST,
               "--prometheus-port": str(WARMUP_ENGINE_PORT + catalog.TOKENSPEED_METRICS_PORT_OFFSET),
               "--load-format": "dummy"}
    out: list[Item] = []
    for item in launch.engine_argv(engine, rank, head_private_ip):
        if isinstance(item, tuple) and item[0] == "--model-loader-extra-config":
            continue  # the dummy loaders refuse any extra config
        if isinstance(item, tuple) and len(item) == 2 and item[0] in replace:
            item = (item[0], replace[item[0]])
        out.append(item)
    if not any(isinstance(i, tuple) and i[0] == "--load-format" for i in out):
        out.append(("--load-format", "dummy"))
    if exits_by_itself(engine):
        # `sglang serve FLAGS` becomes the tool with the same flags, and the tool's own deadline.
        head = out[0]
        if head != ("sglang", "serve"):
            raise ValueError(f"the SGLang launch starts with {head!r}, not `sglang serve`")
        out = [SGLANG_COMPILE_TOOL, *out[1:], ("--timeout", str(timeout_s))]
    return out


def docker_run_argv(engine: EngineInputs, rank: int, *, private_ip: str, head_private_ip: str, hf_dir: Word,
                    cache_dir: Word, timeout_s: int) -> list[Item]:
    """`docker run` of the warm-up: the launch's container (image, GPUs, mounts, cache folders, environment) under
    its own name, never restarted, with the warm-up's engine command line."""
    return launch.docker_run_argv(
        engine, rank, private_ip=private_ip, head_private_ip=head_private_ip, hf_dir=hf_dir,
        cache_dir=cache_dir, fingerprint=None, name=CONTAINER_NAME, restart="no",
        command=engine_argv(engine, rank, head_private_ip, timeout_s))


def command_text(engine: EngineInputs, rank: int, head_private_ip: str, timeout_s: int) -> str:
    """The warm-up's engine command, for the plan."""
    return shell_words(launch.flatten(engine_argv(engine, rank, head_private_ip, timeout_s)))
