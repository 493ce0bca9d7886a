"""`python -m kimi_cluster.fakes.inference_server`: real-engine style flags read into settings, the kernel warm-up, then
serving until SIGTERM."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from collections.abc import Sequence

from .group import Group, serve_dummy_health
from .server import FakeInferenceServer
from .settings import DEFAULT_MODEL, ENGINES, FAULTS, FakeSettings
from .warmup import warm_up


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m kimi_cluster.fakes.inference_server",
        # an engine flag the fake does not know must never be read as an abbreviation of one it does
        allow_abbrev=False,
        description="Fake SGLang/vLLM server for Kimi K3.1 Pro. Unknown engine flags are ignored. "
        "A leading positional model (as `vllm serve MODEL` or the vllm-openai image takes it) implies --engine vllm.",
    )
    parser.add_argument("--engine", choices=ENGINES, help="answer shape; guessed from the flags if omitted")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--listen", action="append", default=[], metavar="HOST:PORT",
                        help="serve on these addresses instead of --host/--port (repeatable); a container's port "
                        "published on several host addresses is one server on each")
    parser.add_argument("--served-model-name", nargs="+", help="model id(s) to serve (SGLang takes one)")
    parser.add_argument("--model-path", help="SGLang's model flag")
    parser.add_argument("--model", dest="model_flag", help="vLLM's --model flag")
    parser.add_argument("--api-key-file", help="file holding the API key (preferred over --api-key)")
    parser.add_argument("--api-key", help="API key; argv is visible in ps, prefer --api-key-file or KIMI_API_KEY")
    parser.add_argument("--context-length", type=int, help="SGLang's context length, reported as max_model_len")
    parser.add_argument("--max-model-len", type=int, help="vLLM's context length")
    parser.add_argument("--node-rank", type=int, default=0,
                        help="SGLang rank; ranks above 0 serve no HTTP API, so the fake only idles")
    parser.add_argument("--nnodes", type=int, default=1, help="SGLang's node count: above 1, the ranks form a group")
    parser.add_argument("--dist-init-addr", help="SGLang's rendezvous HOST:PORT, the head's store")
    parser.add_argument("--dist-timeout", type=float, default=600.0,
                        help="seconds a rank tries to reach the head's store (torch's NCCL default: 10 min)")
    parser.add_argument("--tp-size", "--tp", "--tensor-parallel-size", dest="tp", type=int,
                        help="ignored; declared so its value is not taken for the positional model")
    parser.add_argument("--prometheus-host", default="0.0.0.0", help="TokenSpeed's (smg's) metrics listener")
    parser.add_argument("--prometheus-port", type=int, default=None,
                        help="TokenSpeed's metrics port; a free one when not given, as `tokenspeed serve` picks")
    parser.add_argument("--load-format", default="auto",
                        help="the engines' loader; 'dummy' (random weights) compiles the same kernels, as they do")
    parser.add_argument("--compile-only", action="store_true",
                        help="compile the kernels, then exit 0 without serving (SGLang's compile_deep_gemm)")
    parser.add_argument("--enable-scale-out", action="store_true",
                        help="vLLM's scale-out endpoints: the token API /inference/v1/generate (403 without it)")
    parser.add_argument("--fault", action="append", default=[],
                        help="break the server on purpose (repeatable or comma list): " + ", ".join(FAULTS))
    parser.add_argument("--slow-seconds", type=float, default=30.0, help="delay of the 'slow' fault")
    parser.add_argument("--verbose", action="store_true", help="log each request to stderr")
    return parser


def _read_key(args: argparse.Namespace) -> str | None:
    if args.api_key_file:
        with open(args.api_key_file, encoding="utf-8") as handle:
            key = handle.read().strip()
        if not key:
            raise SystemExit(f"--api-key-file {args.api_key_file} is empty")
        return key
    return args.api_key or os.environ.get("KIMI_API_KEY") or os.environ.get("VLLM_API_KEY") or None


def settings_from_args(argv: Sequence[str] | None = None) -> tuple[FakeSettings, argparse.Namespace, list[str]]:
    """Parse real-engine style flags into settings; returns the ignored flags too."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["serve"]:
        argv = argv[1:]
    # Only a leading bare word is the model: later ones are values of engine flags the fake ignores
    # (`--nnodes 4`), which argparse cannot tell from positionals.
    positional = argv.pop(0) if argv and not argv[0].startswith("-") else None
    args, ignored = _parser().parse_known_args(argv)
    engine = args.engine or ("vllm" if (positional or args.model_flag or args.max_model_len) else "sglang")
    names = tuple(args.served_model_name or [positional or args.model_flag or args.model_path or DEFAULT_MODEL])
    faults = frozenset(f.strip() for raw in args.fault for f in raw.split(",") if f.strip())
    settings = FakeSettings(
        engine=engine,
        served_model_names=names,
        api_key=_read_key(args),
        max_model_len=args.context_length or args.max_model_len or FakeSettings.max_model_len,
        faults=faults,
        slow_seconds=args.slow_seconds,
        token_seconds=float(os.environ.get("FAKE_ENGINE_TOKEN_SECONDS") or 0),
        scale_out=args.enable_scale_out,
    )
    return settings, args, ignored



def main(argv: Sequence[str] | None = None) -> int:
    try:
        settings, args, ignored = settings_from_args(argv)
    except ValueError as exc:
        print(f"fake-inference: {exc}", file=sys.stderr)
        return 2
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    warm_up(settings.engine, args, ignored, dict(os.environ),
            float(os.environ.get("FAKE_ENGINE_COMPILE_SECONDS") or 0), stop)
    if args.compile_only:
        if stop.is_set():
            return 128 + signal.SIGTERM  # as a process ended by SIGTERM reports it
        print("fake-inference: kernels compiled; exiting (compile only)", file=sys.stderr, flush=True)
        return 0
    group = None
    if settings.engine == "sglang" and args.nnodes > 1 and args.dist_init_addr:
        group = Group(args.nnodes, args.node_rank, args.dist_init_addr, args.dist_timeout)
        group.start(stop)
    if args.node_rank > 0:
        print(f"fake-inference: rank {args.node_rank} serves no HTTP API (as SGLang), only its dummy /health; "
              "idling", file=sys.stderr)
        try:
            dummies = serve_dummy_health([_address(a) for a in args.listen] or [(args.host, args.port)])
        except (OSError, ValueError) as exc:
            print(f"fake-inference: cannot listen: {exc}", file=sys.stderr)
            return 1
        while not stop.wait(1.0):
            pass
        for dummy in dummies:
            dummy.shutdown()
            dummy.server_close()
        return 0
    if group is not None:
        # SGLang's head serves HTTP only once every rank has joined and the model is loaded.
        while not group.formed.wait(0.5):
            if stop.is_set():
                return 128 + signal.SIGTERM
    try:
        addresses = [_address(a) for a in args.listen] or [(args.host, args.port)]
        # One metrics listener for the gateway (TokenSpeed), beside its first API address.
        metrics = (args.prometheus_host, args.prometheus_port or 0)
        servers = [FakeInferenceServer(settings, host, port, verbose=args.verbose,
                                       metrics_address=metrics if i == 0 else None)
                   for i, (host, port) in enumerate(addresses)]
    except (OSError, ValueError) as exc:
        print(f"fake-inference: cannot listen: {exc}", file=sys.stderr)
        return 1
    where = ", ".join(f"{host}:{server.port}" for (host, _), server in zip(addresses, servers, strict=True))
    print(
        f"fake-inference: {settings.engine} shape on {where} serving "
        f"{list(settings.model_ids)}; key {'required' if settings.api_key else 'NOT set (open)'}; "
        f"faults {sorted(settings.faults) or 'none'}"
        + (f"; ignored flags {ignored}" if ignored else ""),
        file=sys.stderr,
        flush=True,
    )
    for server in servers:
        server.httpd.group = group
        server.start()
    try:
        while not stop.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        for server in servers:
            server.stop()
    return 0


def _address(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"--listen expects HOST:PORT, got {text!r}")
    return host, int(port)
