"""The engine's command line and the `docker run` around it, per engine and rank, as data.

Shared by the launch template (which runs it) and the offline plan (which prints it), so the command a reviewer reads
is the command a node runs. Items are words or (flag, value) pairs that stay on one line; `flatten` gives the argv.
Everything here reads one `EngineInputs`, which the blueprint fills from the settings (kimi_cluster/blueprint/).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from kimi_cluster.plan.jinja import ShellExpr, shell_words
from kimi_cluster.settings import DIST_INIT_PORT, NAMESPACE, catalog, shown

Word = str | ShellExpr
Item = Word | tuple

CONTAINER_NAME = "kimi-engine"
PARSER = "kimi_k3"
FINGERPRINT_LABEL = "kimi-cluster.fingerprint"
# The engines find the weights where huggingface_hub puts them by default, under HF_HOME.
CONTAINER_HF_HOME = "/root/.cache/huggingface"
# Everything else the engines cache (JIT kernels, compile graphs) lives under here, mounted from the storage path so
# a restart reuses it; its host folder name never changes (a changing name makes the engine redo its kernel tuning
# on every boot).
CONTAINER_CACHE = "/root/.cache"
# The engine gets no API key at all (not on its command line, in its environment or in its log): it listens on the
# head's loopback only, and the TLS proxy in front of it (kimi_cluster/plan/proxy.py) checks the key.
ENGINE_HOST = "127.0.0.1"
# TokenSpeed's release image installs it with `pip install --user` as its base image's user `runner`
# (docker/Dockerfile.release), and TokenSpeed's docs mount the cache at /home/runner/.cache
# (docs/guides/getting-started.md): its weights and caches go there, and that user must write the cache folder.
_CONTAINER_HOME = {"tokenspeed": "/home/runner"}
PLACEHOLDER_NIC = ShellExpr("${NIC}")
PLACEHOLDER_THREADS = ShellExpr("${OMP_THREADS}")
PLACEHOLDER_FINGERPRINT = ShellExpr("${FINGERPRINT}")
# SGLang's loader settings as JSON, with the node's ${OMP_THREADS} in it: launch.sh.j2 writes it before `docker run`.
PLACEHOLDER_LOADER_CONFIG = ShellExpr("${LOADER_CONFIG}")

# Runs inside the container before the engine, also on every automatic restart: a /dev/shm left full by the previous
# run crash-loops NCCL (llm-d #352). With --ipc=host this is the host's /dev/shm, which only the engine uses.
_CLEAR_SHM = "find /dev/shm -mindepth 1 -maxdepth 1 -exec rm -rf {} + 2>/dev/null"
_WRAPPER = f'{_CLEAR_SHM}; exec "$@"'


@dataclass(frozen=True)
class EngineInputs:
    """What the engine's command line and container are made of: the settings' values of the same names."""

    engine_name: str
    model: str
    model_revision: str
    served_name: str
    engine_port: int
    extra_engine_args: tuple[str, ...]
    max_model_len: int | None
    engine_layout: str | None
    layout: catalog.EngineLayout | None
    model_spec: catalog.ModelSpec
    tensor_parallel: int
    nodes: int
    gpu: catalog.GpuSpec
    has_front: bool
    resumes_streams: bool
    container_image: str
    storage_path: str


def container_cache(engine: EngineInputs) -> str:
    """The container's ~/.cache for this engine's image: /root/.cache, or the image user's."""
    home = _CONTAINER_HOME.get(engine.engine_name)
    return f"{home}/.cache" if home else CONTAINER_CACHE


def container_hf_home(engine: EngineInputs) -> str:
    return f"{container_cache(engine)}/huggingface"


def cache_dir_mode(engine: EngineInputs) -> str:
    """chmod mode (recursive) the launch gives the host's cache folder, or "" to leave it: an image whose user is
    not root must write its kernels there, restored ones included (the node steps create them as root)."""
    return "a+rwX" if engine.engine_name in _CONTAINER_HOME else ""


def flatten(items: Sequence[Item]) -> list[Word]:
    """The plain argv of items that may hold (flag, value) pairs."""
    out: list[Word] = []
    for item in items:
        out.extend(item if isinstance(item, tuple) else (item,))
    return out


def needs_marlin(engine: EngineInputs) -> bool:
    """Hopper has no FP4 tensor cores: SGLang serves the MXFP4 experts through the Marlin W4A16 kernel
    (`--moe-runner-backend marlin`; SGLang picks its native MXFP4 runner only on Blackwell)."""
    return engine.gpu.name.startswith(("H100", "H200"))


# Other spellings of flags the program sets (SGLang's ServerArgs.add_cli_args, vLLM's make_arg_parser), and flags it
# owns without always passing them: extraEngineArgs may set none of these.
_OWNED_ALIASES = {
    # The parallelism is topology's: data and pipeline parallel too, which the sizing does not plan for.
    "sglang": ("--model", "--tensor-parallel-size", "--tp", "--expert-parallel-size", "--ep", "--api-key",
               "--nnodes", "--node-rank", "--dist-init-addr", "--context-length", "--dp-size",
               "--data-parallel-size", "--pp-size", "--pipeline-parallel-size"),
    # The layout's parallelism is engineLayout's, in every layout (vLLM's short spellings -tp, -dp, -dcp too).
    # TokenSpeed 0.1.1: its CLI's aliases (cli/_argsplit.py), ServerArgs' parallelism and the smg gateway's key.
    "tokenspeed": ("--model", "--model-path", "--tp", "--tensor-parallel-size", "--attn-tp-size", "--world-size",
                   "--nprocs-per-node", "--nnodes", "--node-rank", "--dist-init-addr", "--headless", "--api-key",
                   "--control-port", "--prometheus-port", "--prometheus-host", "--max-model-len",
                   "--data-parallel-size", "--dp-size"),
    # vLLM's data-parallel placement (-dpl, -dpr, -dpn) and pipeline parallel belong to the layout as well.
    "vllm": ("--model", "-tp", "--api-key", "--max-model-len", "--headless", "--data-parallel-address",
             "--tensor-parallel-size", "--data-parallel-size", "-dp", "--decode-context-parallel-size", "-dcp",
             "--pipeline-parallel-size", "-pp", "--data-parallel-size-local", "-dpl", "--data-parallel-start-rank",
             "-dpr", "--data-parallel-rank", "-dpn"),
}


def flag_name(arg: str) -> str | None:
    """`--tp_size=8` -> `--tp-size`; None for a value. vLLM's parser also takes underscores for dashes."""
    if not arg.startswith("-") or arg == "-" or arg[1:2].isdigit():
        return None
    name = arg.split("=", 1)[0]
    dashes = len(name) - len(name.lstrip("-"))
    return name[:dashes] + name[dashes:].replace("_", "-")


def owned_flags(engine: EngineInputs) -> frozenset[str]:
    """Every flag the program's command line sets for this engine, with its aliases."""
    argv = flatten(_program_argv(engine, 0, "<head>"))
    flags = {w for w in argv if isinstance(w, str) and flag_name(w)}
    return frozenset(flags | set(_OWNED_ALIASES[engine.engine_name]))


def media_env(engine_name: str, extra_engine_args: Sequence[str]) -> list[tuple[str, str]]:
    """vLLM's media fetching, for the replicas and the front's render server alike (kimi_cluster/plan/resume.py):
    with --allowed-media-domains in extraEngineArgs, redirects are not followed (VLLM_MEDIA_URL_ALLOW_REDIRECTS=0), or
    a listed host's redirect would fetch from any address (vLLM 0.33.0's MediaConnector checks the URL's host only,
    then follows redirects: vllm/multimodal/media/connector.py). data: URIs are never fetched, so they always work."""
    if engine_name != "vllm" or "--allowed-media-domains" not in {flag_name(arg) for arg in extra_engine_args}:
        return []
    return [("VLLM_MEDIA_URL_ALLOW_REDIRECTS", "0")]


def engine_arg_problems(engine: EngineInputs) -> list[str]:
    """Every extraEngineArgs entry that names a flag the program owns (owned_flags), each naming the key to set
    instead; kimi_cluster/settings/loader.py refuses the stack with them once the rest of the settings are valid."""
    owned = owned_flags(engine)
    problems = []
    for arg in engine.extra_engine_args:
        flag = flag_name(arg)
        if flag is None:
            continue
        # argparse also takes an unambiguous prefix (--tp-s for --tp-size) unless allow_abbrev is off.
        hit = next((o for o in sorted(owned) if o == flag or (len(flag) > 3 and o.startswith(flag))), None)
        if hit:
            problems.append(f"{NAMESPACE}:extraEngineArgs may not set {hit} ({shown(arg)}): the program owns it; "
                            "set the matching key instead (apiPort, servedModelName, maxModelLen, engineLayout, "
                            "topology ...)")
    return problems


def engine_argv(engine: EngineInputs, rank: int, head_private_ip: str) -> list[Item]:
    """The engine's own command line inside the container: the program's flags, then extraEngineArgs (which the
    settings refuse if they name a flag the program owns)."""
    return _program_argv(engine, rank, head_private_ip) + list(engine.extra_engine_args)


def engine_host(engine: EngineInputs, rank: int, head_private_ip: str) -> str:
    """Loopback behind the head's own proxy; behind a front (replicas >= 2) the head binds its private address, which
    the firewall opens to the front's /32 alone."""
    return head_private_ip if engine.has_front and rank == 0 else ENGINE_HOST


def _program_argv(engine: EngineInputs, rank: int, head_private_ip: str) -> list[Item]:
    port = str(engine.engine_port)
    host = engine_host(engine, rank, head_private_ip)
    if engine.engine_name == "vllm":
        items: list[Item] = [
            ("vllm", "serve", engine.model),
            ("--revision", engine.model_revision),
            ("--served-model-name", engine.served_name),
            "--trust-remote-code",
            *_vllm_layout(engine),
            ("--load-format", "fastsafetensors"),
            "--enable-auto-tool-choice",
            ("--tool-call-parser", PARSER),
            ("--reasoning-parser", PARSER),
            ("--host", host),
            ("--port", port),
        ]
        if engine.resumes_streams:
            # The token API (`/inference/v1/generate`) the front's resuming layer generates through: `vllm serve`
            # answers it 403 without this flag (vLLM 0.33.0, vllm/entrypoints/scale_out/factories.py).
            items.append("--enable-scale-out")
        max_len = engine.max_model_len
        if max_len is None and engine.engine_layout == "tp8-dcp8":
            # The layout exists for long sessions: ask for the model's whole context unless maxModelLen says less.
            max_len = engine.model_spec.context_window
        if max_len:
            items.append(("--max-model-len", str(max_len)))
    elif engine.engine_name == "tokenspeed":
        items = _tokenspeed_argv(engine, port, host)
    else:
        tp = str(engine.tensor_parallel)
        items = [
            ("sglang", "serve"),
            "--trust-remote-code",
            ("--model-path", engine.model),
            ("--revision", engine.model_revision),
            ("--served-model-name", engine.served_name),
            ("--tp-size", tp),
            ("--ep-size", tp),
        ]
        if engine.nodes > 1:
            items += [
                ("--nnodes", str(engine.nodes)),
                ("--node-rank", str(rank)),
                ("--dist-init-addr", f"{head_private_ip}:{DIST_INIT_PORT}"),
                # The rendezvous waits for every rank; an hour covers the slowest node's weight load.
                ("--dist-timeout", "3600"),
            ]
        if needs_marlin(engine):
            items.append(("--moe-runner-backend", "marlin"))
        items += [
            # Multi-threaded safetensors loading, each GPU worker on its share of the node's cores (the share
            # OMP_NUM_THREADS gets) instead of SGLang's 8 (DefaultModelLoader.DEFAULT_NUM_THREADS, 0.5.23). Naming
            # enable_multithread_load also keeps it on should checkpoint prefetching be turned on, which otherwise
            # falls back to one thread (sglang/srt/model_loader/loader.py, "local NVMe ... multi-threading helps").
            ("--model-loader-extra-config", PLACEHOLDER_LOADER_CONFIG),
            ("--mem-fraction-static", "0.85"),
            ("--max-running-requests", "64"),
            ("--reasoning-parser", PARSER),
            ("--tool-call-parser", PARSER),
            ("--host", host),
            ("--port", port),
        ]
        if engine.max_model_len:
            items.append(("--context-length", str(engine.max_model_len)))
    return items


def tokenspeed_metrics_port(engine: EngineInputs) -> int:
    """The smg gateway's Prometheus listener: pinned (TokenSpeed picks a random one otherwise) so the proxy can
    forward /metrics to it; the control server takes the port below it (catalog.py)."""
    return engine.engine_port + catalog.TOKENSPEED_METRICS_PORT_OFFSET


def _tokenspeed_argv(engine: EngineInputs, port: str, host: str) -> list[Item]:
    """`tokenspeed serve`: its CLI splits these between the engine (ServerArgs) and the smg gateway (host, port,
    parsers, metrics). Kimi-K3 at TP8 wants the vision encoder at TP1 x DP8 and an FP8 KV cache (docs/recipes)."""
    items: list[Item] = [
        ("tokenspeed", "serve", engine.model),
        ("--revision", engine.model_revision),
        ("--served-model-name", engine.served_name),
        "--trust-remote-code",
        ("--tensor-parallel-size", str(engine.tensor_parallel)),
        ("--mm-encoder-tp-mode", "data"),
        ("--kv-cache-dtype", "fp8"),
        # The loader reads the safetensors shards ahead into the page cache on this many threads per GPU worker
        # (ServerArgs.weight_loader_prefetch_num_threads, 8 by default): each worker gets its share of the node's
        # cores, the same share as OMP_NUM_THREADS (launch.sh.j2 sets ${OMP_THREADS} before `docker run`).
        ("--weight-loader-prefetch-num-threads", PLACEHOLDER_THREADS),
        # TokenSpeed's own names for Kimi K3's parsers (cli/serve_smg.py KIMI_K3_*_PARSER), the same words.
        ("--reasoning-parser", PARSER),
        ("--tool-call-parser", PARSER),
        ("--host", host),
        ("--port", port),
        # Counters stay on the head's loopback, behind its proxy or read over SSH: the front never asks for them.
        ("--prometheus-host", ENGINE_HOST),
        ("--prometheus-port", str(tokenspeed_metrics_port(engine))),
    ]
    if engine.max_model_len:
        items.append(("--max-model-len", str(engine.max_model_len)))
    return items


def _vllm_layout(engine: EngineInputs) -> list[Item]:
    """The parallelism flags of the stack's vLLM layout (catalog.VLLM_LAYOUTS); tp8 is the one-node default."""
    layout = engine.layout
    if layout is None or layout.name == "tp8":
        return [("--tensor-parallel-size", str(engine.tensor_parallel))]
    if layout.name == "dp8-ep":
        # Attention replicated on every rank (tensor parallel 1, vLLM's default), experts sharded over the 8.
        return [("--data-parallel-size", str(layout.gpus)), "--enable-expert-parallel"]
    # tp8-dcp8: the KV cache is split over the tensor-parallel group (dcp must divide tp).
    return [("--tensor-parallel-size", str(layout.gpus)), ("--decode-context-parallel-size", str(layout.gpus))]


def container_env(engine: EngineInputs, *, private_ip: str, nic: Word, threads: Word) -> list[tuple[str, Word]]:
    """Environment of the engine container; it holds no secret."""
    cache = container_cache(engine)
    env: list[tuple[str, Word]] = [
        # The weights were checked before launch; the engine must not reach out to the hub again.
        ("HF_HUB_OFFLINE", "1"),
        ("HF_HOME", container_hf_home(engine)),
        # HF_HOME is mounted read-only (docker_run_argv); --trust-remote-code writes the model's own code here,
        # in the writable cache folder instead (outside the kernel cache's allow-list: it never travels).
        ("HF_MODULES_CACHE", f"{cache}/hf-modules"),
        # Each GPU worker gets its share of the node's cores rather than all of them: when every worker claims all
        # cores, loading the weights is oversubscribed and many times slower.
        ("OMP_NUM_THREADS", threads),
        ("TRITON_CACHE_DIR", f"{cache}/triton"),
        ("TORCHINDUCTOR_CACHE_DIR", f"{cache}/torchinductor"),
        ("DG_JIT_CACHE_DIR", f"{cache}/deep_gemm"),
    ]
    if engine.engine_name == "vllm":
        env += [
            ("VLLM_ENGINE_READY_TIMEOUT_S", "3600"),
            ("VLLM_CACHE_ROOT", f"{CONTAINER_CACHE}/vllm"),
            *media_env(engine.engine_name, engine.extra_engine_args),
        ]
    elif engine.engine_name == "tokenspeed":
        # TokenSpeed's own kernel caches, by the names tokenspeed-kernel 0.1.4 reads (ops/tuning.py,
        # thirdparty/msa/jit.py); both default under ~/.cache too, named here so the folder never moves. Not its
        # default ~/.cache/tokenspeed/...: the kernel cache never packs a path with "token" in it (a secret's name).
        env += [
            ("TOKENSPEED_FLASHINFER_AUTOTUNE_CACHE_DIR", f"{cache}/autotune/flashinfer"),
            ("MINFER_FMHA_CACHE_DIR", f"{cache}/minfer/fmha_sm100"),
        ]
    else:
        env += [
            ("NCCL_CUMEM_ENABLE", "1"),
            ("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True"),
            ("SGLANG_ENABLE_TP_MEMORY_INBALANCE_CHECK", "0"),
        ]
        if engine.nodes > 1:
            env += [
                ("SGLANG_HOST_IP", private_ip),
                # Collectives run over TCP on the private network only (no InfiniBand on these VMs).
                ("NCCL_SOCKET_IFNAME", nic),
                ("GLOO_SOCKET_IFNAME", nic),
                ("NCCL_IB_DISABLE", "1"),
            ]
    return env


def _env_word(name: str, value: Word) -> Word:
    return ShellExpr(f"{name}={value}") if isinstance(value, ShellExpr) else f"{name}={value}"


def docker_run_argv(
    engine: EngineInputs,
    rank: int,
    *,
    private_ip: str,
    head_private_ip: str,
    hf_dir: Word,
    cache_dir: Word,
    nic: Word = PLACEHOLDER_NIC,
    threads: Word = PLACEHOLDER_THREADS,
    fingerprint: Word | None = PLACEHOLDER_FINGERPRINT,
    name: str = CONTAINER_NAME,
    restart: str = "unless-stopped",
    command: Sequence[Item] | None = None,
) -> list[Item]:
    """`docker run` for this rank. Host paths are parameters: the template passes node-root-relative expressions.
    `name`, `restart` and the engine's `command` line (default: engine_argv's) differ for the kernel warm-up
    (kimi_cluster/plan/warmup.py), which runs the same container otherwise."""
    items: list[Item] = [("docker", "run", "-d"), ("--name", name), ("--restart", restart)]
    if fingerprint is not None:
        items.append(("--label", _env_word(FINGERPRINT_LABEL, fingerprint)))
    # Host network for both engines: the engine binds the head's loopback, which a published port could not reach.
    items += [("--gpus", "all"), ("--network", "host")]
    if engine.engine_name == "vllm":
        # Not --privileged, which the recipe's command has: a compromised engine would be root on the host. vLLM's
        # own `docker run` (docs.vllm.ai, "Deploying with Docker") needs only the GPUs and --ipc=host; this is one
        # node (no InfiniBand devices to map) and, at TP 8, vLLM's fastsafetensors loader reads with pread (nogds),
        # not through GPUDirect Storage's /dev/nvidia-fs*.
        items += ["--ipc=host"]
    elif engine.engine_name == "tokenspeed":
        items += ["--ipc=host", ("--ulimit", "memlock=-1")]
    else:
        items += ["--ipc=host", ("--shm-size", "32g"), ("--ulimit", "memlock=-1"), ("--ulimit", "stack=67108864")]
    items += [
        ("--log-opt", "max-size=200m"), ("--log-opt", "max-file=5"),
        # Read-only: the node's root weights step and peer server write and serve these files, and an engine that
        # could write there could swap a verified blob for a link to a host secret (issue 34).
        ("-v", _mount(hf_dir, container_hf_home(engine), read_only=True)),
        ("-v", _mount(cache_dir, container_cache(engine))),
    ]
    env = container_env(engine, private_ip=private_ip, nic=nic, threads=threads)
    items += [("-e", _env_word(k, v)) for k, v in env]
    # sh runs the wrapper with $0 = the container name and "$@" = the engine's command line.
    items += [("--entrypoint", "/bin/sh"), engine.container_image, ("-c", _WRAPPER, name)]
    items += engine_argv(engine, rank, head_private_ip) if command is None else list(command)
    return items


def _mount(host: Word, container: str, read_only: bool = False) -> Word:
    spec = f"{host}:{container}" + (":ro" if read_only else "")
    return ShellExpr(spec) if isinstance(host, ShellExpr) else spec


def launch_fingerprint(engine: EngineInputs, rank: int, private_ip: str, head_private_ip: str) -> str:
    """Identifies one launch configuration; a running container with the same label is left alone on a re-run."""
    argv = docker_run_argv(engine, rank, private_ip=private_ip, head_private_ip=head_private_ip,
                           hf_dir=ShellExpr("${HF}"), cache_dir=ShellExpr("${CACHE}"), fingerprint=None)
    return hashlib.sha256(shell_words(flatten(argv)).encode()).hexdigest()[:16]


def launch_command_text(engine: EngineInputs, rank: int, head_private_ip: str, private_ip: str | None = None) -> str:
    """The launch command for the plan, with the paths of a real node; NIC and thread count are found on the node."""
    storage = engine.storage_path.rstrip("/") or ""
    argv = docker_run_argv(
        engine, rank,
        private_ip=private_ip or f"<node{rank}-private-ip>",
        head_private_ip=head_private_ip,
        hf_dir=f"{storage}/hf",
        cache_dir=f"{storage}/cache/{engine.engine_name}",
        fingerprint=None,
    )
    return shell_words(argv, continuation=" \\\n  ")
