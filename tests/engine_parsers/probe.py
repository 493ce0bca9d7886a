"""Parses an engine command line with the engine's own parser, from the pinned wheels, and prints what it read.

Run by tests/engine_parsers/test_engine_parsers.py under the parsers' virtualenv (tests/engine_parsers/install.sh),
never imported by the project: vLLM and TokenSpeed pin their own torch, pydantic and openai, which must not meet the
project's pins. Reads a list of requests {"engine": "vllm" | "vllm-render" (`vllm launch render`) | "vllm-options"
(every flag of its parser) | "tokenspeed" | "sglang" | "sglang-compile-tool", "argv": [...flags after `<engine> serve`
or the tool's module]} on stdin and prints one JSON list of answers in the same order, each {"ok": true, "values":
{...}} or {"ok": false, "error": "..."}. One process answers them all: importing vLLM (torch with it) costs
some 15 CPU-seconds.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any


def vllm(argv: list[str]) -> dict[str, Any]:
    """`vllm serve`'s parser (make_arg_parser) and its pre-load validation (validate_parsed_serve_args)."""
    # vLLM fills defaults from the current platform and refuses to guess one on a machine without a GPU; its own
    # CPU platform stands in. It changes defaults only, never which flags or values the parser accepts.
    import vllm.platforms as platforms
    from vllm.platforms.cpu import CpuPlatform

    platforms._current_platform = CpuPlatform()
    from vllm.entrypoints.common.cli_args import make_arg_parser, validate_parsed_serve_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = make_arg_parser(FlexibleArgumentParser())
    args = parser.parse_args(argv)
    validate_parsed_serve_args(args)
    return {k: getattr(args, k, None) for k in (
        "model_tag", "revision", "served_model_name", "trust_remote_code", "tensor_parallel_size",
        "data_parallel_size", "decode_context_parallel_size", "enable_expert_parallel", "max_model_len",
        "load_format", "enable_auto_tool_choice", "tool_call_parser", "reasoning_parser", "host", "port",
        "enable_scale_out")}


def vllm_render(argv: list[str]) -> dict[str, Any]:
    """`vllm launch render`'s own parser, as vLLM's CLI builds it (vllm/entrypoints/cli/launch.py), with every
    value of the chat layer's flags as it read them, and the engine arguments its ModelConfig is made from."""
    import vllm.platforms as platforms
    from vllm.platforms.cpu import CpuPlatform

    platforms._current_platform = CpuPlatform()
    from vllm import AsyncEngineArgs
    from vllm.entrypoints.cli.launch import LaunchSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    LaunchSubcommand().subparser_init(parser.add_subparsers(dest="subparser"))
    args = parser.parse_args(argv)
    engine = AsyncEngineArgs.from_cli_args(args)
    return {"launch_command": args.launch_command.__qualname__, "model_tag": args.model_tag,
            "port": args.port, "host": args.host, "revision": engine.revision,
            "chat_template": args.chat_template, "default_chat_template_kwargs": args.default_chat_template_kwargs,
            "chat_template_content_format": args.chat_template_content_format,
            "generation_config": engine.generation_config,
            "override_generation_config": engine.override_generation_config, "tokenizer": engine.tokenizer,
            "tokenizer_mode": engine.tokenizer_mode, "tokenizer_revision": engine.tokenizer_revision,
            "hf_overrides": engine.hf_overrides, "max_logprobs": engine.max_logprobs,
            "allowed_media_domains": engine.allowed_media_domains}


def vllm_options(_argv: list[str]) -> dict[str, Any]:
    """Every option string of `vllm serve`'s parser, which `vllm launch render` shares."""
    import vllm.platforms as platforms
    from vllm.platforms.cpu import CpuPlatform

    platforms._current_platform = CpuPlatform()
    from vllm.entrypoints.common.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = make_arg_parser(FlexibleArgumentParser())
    return {"options": sorted(o for action in parser._actions for o in action.option_strings)}


def _tokenspeed_engine_options(server_args: Path) -> tuple[set[str], dict[str, list[str]]]:
    """Every option string of TokenSpeed's ServerArgs.add_cli_args, and the literal choices of each, read from the
    wheel's source: the module itself cannot be imported without a GPU (tokenspeed-kernel probes one at import)."""
    tree = ast.parse(server_args.read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ServerArgs")
    fn = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "add_cli_args")
    flags: set[str] = set()
    choices: dict[str, list[str]] = {}
    for call in ast.walk(fn):
        if not (isinstance(call, ast.Call) and getattr(call.func, "attr", "") == "add_argument"):
            continue
        names = [a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        flags.update(n for n in names if n.startswith("--"))
        for kw in call.keywords:
            if kw.arg == "choices" and isinstance(kw.value, (ast.List, ast.Tuple)):
                values = [e.value for e in kw.value.elts if isinstance(e, ast.Constant)]
                if len(values) == len(kw.value.elts):
                    for n in names:
                        choices[n] = [str(v) for v in values]
    return flags, choices


def tokenspeed(argv: list[str]) -> dict[str, Any]:
    """`tokenspeed serve`: its own splitter (cli/_argsplit.py) routes each flag to the engine or the smg gateway;
    the gateway's part is parsed by smg's parser (launch_router.parse_router_args, what `python -m smg launch` runs),
    the engine's part is checked against ServerArgs' options and choices."""
    spec = importlib.util.find_spec("tokenspeed")
    assert spec is not None and spec.submodule_search_locations
    root = Path(next(iter(spec.submodule_search_locations)))
    flags, choices = _tokenspeed_engine_options(root / "runtime/utils/server_args.py")
    from tokenspeed.cli import _argsplit

    # The splitter asks ServerArgs for its flags through this cached helper; the same set, read from the source.
    _argsplit._engine_recognized_flags = lambda: flags
    split = _argsplit.split_argv(argv)
    engine: dict[str, Any] = {}
    i = 0
    while i < len(split.engine):
        name = split.engine[i]
        value = split.engine[i + 1] if i + 1 < len(split.engine) and not split.engine[i + 1].startswith("--") \
            else None
        if name not in flags:
            raise SystemExit(f"the engine (ServerArgs) has no option {name}")
        if value is not None and name in choices and value not in choices[name]:
            raise SystemExit(f"{name} {value}: ServerArgs accepts {choices[name]}")
        engine[name] = value
        i += 2 if value is not None else 1
    from smg.launch_router import parse_router_args

    # As tokenspeed's _proc.spawn_gateway starts it: the engine's gRPC address first, then the routed flags.
    gateway = parse_router_args(["--worker-urls", "grpc://127.0.0.1:50051", "--disable-retries",
                                 "--disable-circuit-breaker", *split.gateway])
    return {"engine": engine, "gateway_argv": split.gateway,
            "gateway": {k: getattr(gateway, k, None) for k in (
                "host", "port", "reasoning_parser", "tool_call_parser", "prometheus_host", "prometheus_port",
                "model_path", "api_key")}}


_SGLANG_VALUES = ("model_path", "revision", "served_model_name", "tp_size", "ep_size", "nnodes", "node_rank",
                  "dist_init_addr", "dist_timeout", "load_format", "model_loader_extra_config", "moe_runner_backend",
                  "host", "port", "context_length")


def _compile_tool_options(parser: argparse.ArgumentParser) -> None:
    """What `python -m sglang.compile_deep_gemm` adds to the server's options (CompileArgs.add_cli_args), read from
    the wheel's source: importing the tool starts importing the whole server, GPU packages included."""
    spec = importlib.util.find_spec("sglang")
    assert spec is not None and spec.submodule_search_locations
    tree = ast.parse((Path(next(iter(spec.submodule_search_locations))) / "compile_deep_gemm.py").read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "CompileArgs")
    fn = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "add_cli_args")
    for call in ast.walk(fn):
        if isinstance(call, ast.Call) and getattr(call.func, "attr", "") == "add_argument":
            names = [a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            kinds = {"int": int, "float": float, "str": str}
            kind = next((kinds[k.value.id] for k in call.keywords
                         if k.arg == "type" and isinstance(k.value, ast.Name) and k.value.id in kinds), str)
            parser.add_argument(*names, type=kind)


def sglang(argv: list[str], tool: bool = False) -> dict[str, Any]:
    """`sglang serve`'s parser (ServerArgs.add_cli_args) and ServerArgs built from it; with `tool`, the compile
    tool's (the same options and its --timeout)."""
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    if tool:
        _compile_tool_options(parser)
    args = parser.parse_args(argv)
    server = ServerArgs.from_cli_args(args)
    values = {k: getattr(server, k, None) for k in _SGLANG_VALUES}
    if tool:
        values["timeout"] = args.timeout
    return values


def answer(request: dict[str, Any]) -> dict[str, Any]:
    engines = {"vllm": vllm, "vllm-render": vllm_render, "vllm-options": vllm_options, "tokenspeed": tokenspeed,
               "sglang": sglang,
               "sglang-compile-tool": lambda argv: sglang(argv, tool=True)}
    try:
        values = engines[request["engine"]](list(request["argv"]))
    # Any refusal is the answer asked for: argparse exits, the validators raise their own types.
    except (SystemExit, Exception) as exc:  # noqa: BLE001 - every refusal, of whatever type, is the answer
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    return {"ok": True, "values": values}


def main() -> int:
    requests = json.load(sys.stdin)
    print(json.dumps([answer(request) for request in requests], default=str))
    return 0


if __name__ == "__main__":
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    sys.exit(main())
