"""The front's resuming layer (replicas >= 2, vLLM or SGLang): the replicas' chat layer and
kimi_cluster/node/resume, as data.

What runs on the front beside Caddy, for `resumeStreams` (Settings.resumes_streams), with vLLM replicas:
- vLLM's own chat layer on the CPU, `vllm launch render` in the engine's pinned image (vLLM 0.33.0,
  vllm/entrypoints/cli/launch.py: "a GPU-less rendering server for preprocessing and postprocessing only"), with
  the chat flags of the replicas' `vllm serve` (kimi_cluster/plan/launch.py), so it renders and parses as they
  would. `VLLM_TARGET_DEVICE=cpu` makes vLLM's CPU platform stand in on a VM without a GPU: without it the CUDA
  image cannot even build its argument parser there ("Failed to infer device type"). It reads the model's config,
  tokenizer and chat template (never a weight) from the hub into its own cache on the front, with the hub token
  from a root-only env file;
- the resuming layer (kimi_cluster/node/resume/), a systemd unit on the front's own Python, on loopback;
- Caddy hands it `POST /v1/chat/completions` after the key check (kimi_cluster/plan/templates/front.Caddyfile.j2).
Both listen on the front's loopback only (RESUME_PORT, RENDER_PORTS); the replicas' engines already admit the front.

With SGLang replicas the chat layer is SGLang 0.5.23's own chat route on the CPU (it has no render server):
kimi_cluster/node/sglang_chat.py, shipped to the front and mounted read-only into the replicas' own image, run by
that image's Python with the replicas' model, revision and served name (the parsers are the replicas' kimi_k3 ones,
set in the program), in the same two slots; the layer is told `--engine sglang` (it generates through the
replicas' `/generate`). The program's text is part of the container's fingerprint, so a new one restarts it.

The render server has two slots (RENDER_SLOTS: a container name and a port each). A new configuration (an image
change) starts in the slot the serving one does not hold, and the old one is removed only once the new one answers;
the resuming layer knows both addresses and calls the one that answers (kimi_cluster/node/resume/render.py). So an
image change leaves no moment without a render server: no new stream passes through unresumed, and no stream going
waits for its chunks while the replicas roll.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kimi_cluster.node.resume.server import DRAIN_S
from kimi_cluster.plan.chat_layer import render_args
from kimi_cluster.plan.front_tuning import DEFAULT_TUNING
from kimi_cluster.plan.jinja import ShellExpr, Verbatim, shell_words
from kimi_cluster.plan.launch import PARSER, Word, media_env
from kimi_cluster.plan.step_scripts import shipped, shipped_packages
from kimi_cluster.plan.steps.model import VmSpot
from kimi_cluster.settings import NAMESPACE, RENDER_PORTS, RESUME_PORT
from kimi_cluster.settings.timing import Timing

# The first slot keeps the name a front made before the second slot existed.
RENDER_SLOTS = tuple(zip(("kimi-render", "kimi-render-spare"), RENDER_PORTS, strict=True))
FINGERPRINT_LABEL = "kimi-cluster.render-fingerprint"
# The layer's two unit names, each with its fingerprint file, used in turn: a new configuration starts under the
# one not serving while the old one finishes its streams (kimi_cluster/node/resume/server.py drains on SIGTERM). The
# first keeps the name and the file a 0.3.0 front made.
UNITS = (("kimi-resume", ShellExpr("${STATE}/resume.fingerprint")),
         ("kimi-resume-spare", ShellExpr("${STATE}/resume-spare.fingerprint")))
# What systemd allows a stopped layer beyond its drain bound (its last answers written, its threads ended) before
# it kills it: TimeoutStopSec is the drain and this.
STOP_MARGIN_S = 30
# How often the step looks whether the old layer has closed its port: it does within milliseconds, and until the
# new one listens every request waits (Caddy retries the dial), so the poll is tight; it lasts a few rounds.
PORT_POLL_S = 0.02
LOOPBACK = "127.0.0.1"
CONTAINER_HF_HOME = "/root/.cache/huggingface"
# The node-side program, shipped with the modules it imports (kimi_cluster/plan/step_scripts.py shipped()).
PROGRAM = ("kimi_cluster/node/resume/__init__.py", "kimi_cluster/node/resume/__main__.py",
           "kimi_cluster/node/resume/wire.py", "kimi_cluster/node/resume/pool.py",
           "kimi_cluster/node/resume/generation.py", "kimi_cluster/node/resume/messages.py",
           "kimi_cluster/node/resume/chat.py", "kimi_cluster/node/resume/render.py",
           "kimi_cluster/node/resume/request.py", "kimi_cluster/node/resume/intake.py",
           "kimi_cluster/node/resume/relay.py",
           "kimi_cluster/node/resume/sglang.py",
           "kimi_cluster/node/resume/server.py")
# SGLang's chat layer program (stdlib and SGLang's own modules), shipped to its own folder on the front and mounted
# read-only into the replicas' image at CONTAINER_PROGRAM, with the resuming layer's request bounds it serves with.
CHAT_PROGRAM = ("kimi_cluster/node/resume/request.py", "kimi_cluster/node/resume/intake.py",
                "kimi_cluster/node/sglang_chat.py")
CHAT_SHIP_TO = ShellExpr("${STATE}/sglang-chat-program")
CONTAINER_PROGRAM = "/opt/kimi-cluster"
# What the step and its logs call the chat layer, by engine.
CHAT_LAYER_NAMES = {"vllm": (Verbatim("vLLM's"), Verbatim("vLLM's render server")),
                    "sglang": (Verbatim("SGLang's"), Verbatim("SGLang's chat layer"))}


@dataclass(frozen=True)
class ResumeInputs:
    """What the front's resuming layer and its render server are made of: the settings' values of the same names
    (`resume_streams` the key as set, `resumes_streams` whether streams do resume on this stack)."""

    engine_name: str
    has_front: bool
    replicas: int
    resume_streams: bool
    resumes_streams: bool
    model: str
    model_revision: str
    served_name: str
    max_model_len: int | None
    extra_engine_args: tuple[str, ...]
    hf_endpoint: str
    container_image: str
    engine_port: int


def streams(layer: ResumeInputs) -> dict[str, object]:
    """Whether streams behind the front carry on when their replica is lost, on which engine, and why (not):
    `kimi-cluster plan` prints it."""
    engine = layer.engine_name
    if not layer.has_front:
        why = (f"one replica ({NAMESPACE}:replicas {layer.replicas}): no front, and no twin to carry a stream on "
               "to")
    elif engine not in CHAT_LAYER_NAMES:
        door = {"tokenspeed": "TokenSpeed renders and parses Kimi K3 inside its smg gateway, compiled (smg_rs): no "
                              "chat layer on the front can give what TokenSpeed gives token for token, and its "
                              "parse endpoints do not stream"}.get(engine, f"{engine} has none")
        why = (f"not on {engine} ({door}): a stream whose replica is lost ends with an error; new requests go "
               "to the other replicas")
    elif not layer.resume_streams:
        why = f"off ({NAMESPACE}:resumeStreams false): a stream whose replica is lost ends with an error"
    elif engine == "sglang":
        why = ("SGLang's own chat route on the front (kimi_cluster/node/sglang_chat.py, in the replicas' image) "
               "renders each stream and parses its tokens; the replicas generate them through /generate, and a lost "
               "replica's stream carries on on another, except a tool turn cut inside its tools section (SGLang "
               "restarts the tool turn's grammar), which ends with an error")
    else:
        handed = render_args(layer.extra_engine_args)
        why = ("vLLM's render server on the front renders each stream with the replicas' chat layer"
               + (f" (extraEngineArgs {' '.join(handed)})" if handed else "")
               + "; the replicas generate its tokens, and a lost replica's stream carries on on another")
    return {"resume": layer.resumes_streams, "engine": engine, "why": why}


def render_urls() -> list[str]:
    return [f"http://{LOOPBACK}:{port}" for _, port in RENDER_SLOTS]


def resume_address() -> str:
    """Where Caddy hands the resumable requests."""
    return f"{LOOPBACK}:{RESUME_PORT}"


# The slot a render server starts in is the step's to choose: its container name and port are shell variables.
SLOT_NAME, SLOT_PORT = ShellExpr("${RENDER_NAME}"), ShellExpr("${RENDER_PORT}")


def render_server_argv(layer: ResumeInputs) -> list[Word | tuple[Word, ...]]:
    """`vllm launch render` with the replicas' chat flags: the same model, revision, served name, parsers and context
    length, and the extraEngineArgs that shape the chat layer (kimi_cluster/plan/chat_layer.py), so that it renders
    and parses exactly as their `vllm serve` does."""
    items: list[Word | tuple[Word, ...]] = [
        ("launch", "render", layer.model),
        ("--revision", layer.model_revision),
        ("--served-model-name", layer.served_name),
        "--trust-remote-code",
        "--enable-auto-tool-choice",
        ("--tool-call-parser", PARSER),
        ("--reasoning-parser", PARSER),
        ("--host", LOOPBACK),
        ("--port", SLOT_PORT),
    ]
    if layer.max_model_len:
        items.append(("--max-model-len", str(layer.max_model_len)))
    return items + render_args(layer.extra_engine_args)


PLACEHOLDER_FINGERPRINT = ShellExpr("${FINGERPRINT}")


def sglang_chat_argv(layer: ResumeInputs) -> list[Word | tuple[Word, ...]]:
    """SGLang's chat layer (kimi_cluster/node/sglang_chat.py) with the replicas' model, revision and served name."""
    return [("-m", "kimi_cluster.node.sglang_chat", layer.model),
            ("--revision", layer.model_revision),
            ("--served-model-name", layer.served_name),
            "--trust-remote-code",
            ("--host", LOOPBACK),
            ("--port", SLOT_PORT)]


def render_docker_argv(layer: ResumeInputs, env_file: Word, hf_cache: Word,
                       fingerprint: Word | None = PLACEHOLDER_FINGERPRINT) -> list:
    """`docker run` of the chat layer: host network (it listens on the front's loopback), its hub cache mounted,
    the hub token from a root-only env file (never an argument or a label), the engine's own image; for SGLang, with
    the shipped program mounted read-only and run by the image's Python."""
    items: list = [("docker", "run", "-d"), ("--name", SLOT_NAME), ("--restart", "unless-stopped")]
    if fingerprint is not None:
        label = f"{FINGERPRINT_LABEL}={fingerprint}"
        items.append(("--label", ShellExpr(label) if isinstance(fingerprint, ShellExpr) else label))
    mount = f"{hf_cache}:{CONTAINER_HF_HOME}"
    if layer.engine_name == "sglang":
        return items + [
            ("--network", "host"),
            ("--log-opt", "max-size=50m"), ("--log-opt", "max-file=3"),
            ("--env-file", env_file),
            ("-e", f"HF_HOME={CONTAINER_HF_HOME}"),
            ("-e", f"HF_ENDPOINT={layer.hf_endpoint}"),
            ("-e", f"PYTHONPATH={CONTAINER_PROGRAM}"),
            ("-v", ShellExpr(mount) if isinstance(hf_cache, ShellExpr) else mount),
            ("-v", ShellExpr(f"{CHAT_SHIP_TO}:{CONTAINER_PROGRAM}:ro")),
            ("--entrypoint", "python3"),
            layer.container_image,
            *sglang_chat_argv(layer),
        ]
    items += [
        ("--network", "host"),
        ("--log-opt", "max-size=50m"), ("--log-opt", "max-file=3"),
        ("--env-file", env_file),
        ("-e", "VLLM_TARGET_DEVICE=cpu"),
        ("-e", f"HF_HOME={CONTAINER_HF_HOME}"),
        ("-e", f"HF_ENDPOINT={layer.hf_endpoint}"),
        *(("-e", f"{name}={value}") for name, value in media_env(layer.engine_name, layer.extra_engine_args)),
        ("-v", ShellExpr(mount) if isinstance(hf_cache, ShellExpr) else mount),
        ("--entrypoint", "vllm"),
        layer.container_image,
        *render_server_argv(layer),
    ]
    return items


REPLICAS_FILE = ShellExpr("${STATE}/resume-replicas")


def replica_urls(head_private_ips: Sequence[str], layer: ResumeInputs) -> list[str]:
    """Every replica's engine, as the resuming layer reaches it (each head's private address)."""
    return [f"http://{ip}:{layer.engine_port}" for ip in head_private_ips]


def resumer_argv(engine_name: str = "vllm") -> list[str]:
    """The resuming layer's flags: where it listens, both render server slots, and the file it reads the replicas
    from (written by the step, read again when it changes: a replica re-created at a new address restarts nothing),
    and the largest body it takes: what the front's Caddy buffers (kimi_cluster/plan/front_tuning.py). Its drain
    bound is its own default (DRAIN_S), which stop_timeout_s reads."""
    renders = [word for url in render_urls() for word in ("--render", url)]
    # vLLM is the layer's default engine: a vLLM front's flags stay those of 0.3.x, so its layer is not restarted.
    engine = ["--engine", engine_name] if engine_name != "vllm" else []
    return ["--listen", resume_address(), *renders, *engine, "--replicas-file", REPLICAS_FILE,
            "--max-body-bytes", str(DEFAULT_TUNING.request_buffer_bytes)]


def stop_timeout_s() -> int:
    """systemd's TimeoutStopSec for the layer's unit: its drain bound (the layer's own default) and a margin."""
    return int(DRAIN_S) + STOP_MARGIN_S


def render_fingerprint(layer: ResumeInputs) -> str:
    """Names one render server configuration (image, flags; not its slot); a running one with the same label is
    left alone, in whichever slot it runs."""
    argv = render_docker_argv(layer, ShellExpr("${RENDER_ENV}"), ShellExpr("${RENDER_HF}"), fingerprint=None)
    digest = hashlib.sha256(shell_words(argv).encode())
    for file in chat_program(layer):  # SGLang's: the container runs the shipped program
        digest.update(f"\0{file.path}\0{file.body}".encode())
    return digest.hexdigest()[:16]


def chat_program(layer: ResumeInputs) -> list:
    """The files the chat layer's container runs from the front's disk: SGLang's program; none for vLLM's."""
    return shipped(CHAT_PROGRAM) if layer.engine_name == "sglang" else []


def resumer_fingerprint(argv: Sequence[str], files: Sequence[tuple[str, str]]) -> str:
    """Names one resuming-layer configuration (its flags and its program's files, as (path, body)): a running unit
    with the same one is left alone, so an image change, which restarts only the render server, cuts no stream."""
    digest = hashlib.sha256("\0".join(argv).encode())
    for path, body in files:
        digest.update(f"\0{path}\0{body}".encode())
    return digest.hexdigest()[:16]


def resume_values(layer: ResumeInputs, spot: VmSpot, timing: Timing, _deadline_s: int, _step: str) -> dict[str, Any]:
    """The resume step's values: the replicas' chat layer in the engine's image, then the resuming layer's
    program."""
    heads = list(spot.front_upstreams or [f"<replica {r} head>" for r in range(layer.replicas)])
    argv, files = resumer_argv(layer.engine_name), shipped(PROGRAM)
    owner, chat_layer = CHAT_LAYER_NAMES[layer.engine_name]
    chat_files = chat_program(layer)
    # The table's summary names vLLM's render server (a vLLM front's step text stays that of 0.3.x); the script's
    # own header names SGLang's chat layer on an SGLang front.
    summary = {} if layer.engine_name == "vllm" else {"summary": Verbatim(
        f"start {chat_layer} and the resuming layer that carries a stream on to another replica when its own is lost")}
    return {**summary, "render_slots": RENDER_SLOTS, "chat_layer_owner": owner, "chat_layer": chat_layer,
            "chat_files": chat_files, "chat_packages": shipped_packages(CHAT_PROGRAM) if chat_files else [],
            "chat_ship_to": CHAT_SHIP_TO, "units": UNITS, "image": layer.container_image,
            "fingerprint": render_fingerprint(layer), "fingerprint_label": FINGERPRINT_LABEL,
            "docker_argv": render_docker_argv(layer, ShellExpr("${RENDER_ENV}"), ShellExpr("${RENDER_HF}")),
            "loopback": LOOPBACK, "resume_address": resume_address(),
            "resumer_argv": argv, "replica_urls": replica_urls(heads, layer), "replicas_file": REPLICAS_FILE,
            "resumer_fingerprint": resumer_fingerprint(argv, [(f.path, f.body) for f in files]),
            "pull_attempts": timing.pull_attempts, "pull_timeout_s": timing.pull_timeout_s,
            "pull_backoff_s": timing.pull_backoff_s, "render_timeout_s": timing.proxy_timeout_s,
            "resume_timeout_s": timing.proxy_timeout_s, "log_tail": timing.log_tail,
            "resume_port": RESUME_PORT, "stop_timeout_s": stop_timeout_s(), "port_poll_s": PORT_POLL_S,
            "ship_files": files, "ship_packages": shipped_packages(PROGRAM), "ship_packed": True}
