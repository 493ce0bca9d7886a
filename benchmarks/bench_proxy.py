"""What the head's TLS proxy adds, measured side by side in one run against a deployed sandbox:

    kimi-cluster sandbox up && python -m benchmarks.bench_proxy [--workdir .sandbox] [--requests 200] \
        [--streams 20]

The same requests go to the engine directly (plain HTTP on the head's loopback, as only the head can reach it) and
through the proxy (TLS verified against the stack's CA, with the key), interleaved so both see the same machine load.
Both are sent from the head itself: the client runs inside the head VM's network namespace
(kimi_cluster/fakes/node_fabric.py),
where the engine's port is reachable.
It prints the p50 and p90 latency of a small chat completion each way and their difference, and the streamed tokens
per second each way and their ratio. Each client keeps its connection open, as the official SDKs do.
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import requests

from kimi_cluster.fakes.node_fabric import FabricConfig
from kimi_cluster.sandbox.kimi import DEFAULT_WORKDIR, Sandbox

REPO_ROOT = Path(__file__).resolve().parents[1]

CHAT = {"messages": [{"role": "user", "content": "Who are you? One sentence."}], "max_tokens": 64,
        "reasoning_effort": "low"}
STREAM = {"messages": [{"role": "user", "content": "Count from 1 to 20, separated by spaces."}], "max_tokens": 2048,
          "reasoning_effort": "low", "stream": True, "stream_options": {"include_usage": True}}


class Side:
    """One way to the engine: a base URL, the headers and the TLS trust that way needs, one kept-alive session."""

    def __init__(self, name: str, base: str, headers: dict[str, str], verify: str | bool) -> None:
        self.name, self.base = name, base
        self.session = requests.Session()
        self.session.trust_env = False  # loopback: no proxy from the environment in between
        self.session.headers.update(headers)
        self.session.verify = verify

    def chat(self, model: str) -> float:
        started = time.perf_counter()
        answer = self.session.post(self.base + "/v1/chat/completions", json={"model": model, **CHAT}, timeout=60)
        answer.raise_for_status()
        answer.json()
        return time.perf_counter() - started

    def stream(self, model: str) -> tuple[int, float]:
        """(completion tokens, seconds from the request to the last chunk)."""
        started = time.perf_counter()
        tokens = chunks = 0
        with self.session.post(self.base + "/v1/chat/completions", json={"model": model, **STREAM}, stream=True,
                               timeout=60) as answer:
            answer.raise_for_status()
            for line in answer.iter_lines():
                if not line.startswith(b"data: ") or line == b"data: [DONE]":
                    continue
                event = json.loads(line[6:])
                if event.get("choices"):
                    chunks += 1
                tokens = (event.get("usage") or {}).get("completion_tokens") or tokens
        return tokens or chunks, time.perf_counter() - started


def _plan(workdir: Path) -> dict[str, Any]:
    """Where the two sides are and what they need (the key and the CA), and the head's namespace, from the stack."""
    outputs, _ = Sandbox(workdir, out=io.StringIO()).outputs()
    record = json.loads((workdir / "sandbox.json").read_text())
    if not outputs.get("endpoint_url") or not record.get("engine_port"):
        raise ValueError("no endpoint in the stack's outputs")
    namespace = FabricConfig.load(workdir / "fabric.json").namespace(outputs["head_public_ip"])
    return {"namespace": namespace, "direct": f"http://127.0.0.1:{record['engine_port']}",
            "proxy": outputs["endpoint_url"], "api_key": outputs["api_key"], "ca": outputs["ca_certificate"],
            "model": outputs["served_model_name"]}


def _sides(plan: dict[str, Any]) -> tuple[Side, Side, str]:
    ca = tempfile.NamedTemporaryFile("w", suffix=".pem", delete=False)
    ca.write(plan["ca"])
    ca.close()
    direct = Side("direct", plan["direct"], {}, True)
    proxied = Side("proxy", plan["proxy"], {"Authorization": f"Bearer {plan['api_key']}"}, ca.name)
    return direct, proxied, plan["model"]


def _on_the_head(plan: dict[str, Any], requests_n: int, streams_n: int) -> dict[str, Any]:
    """This benchmark's `--from-node` in the head's namespace; the plan, with the key, goes by stdin, not argv."""
    argv = ["ip", "netns", "exec", plan["namespace"], sys.executable, "-m", "benchmarks.bench_proxy", "--from-node",
            "--requests", str(requests_n), "--streams", str(streams_n)]
    done = subprocess.run(argv, input=json.dumps(plan), capture_output=True, text=True, cwd=REPO_ROOT, timeout=3600)
    if done.returncode != 0:
        raise RuntimeError(f"the measurement on the head failed: {done.stderr.strip()[-500:]}")
    return dict(json.loads(done.stdout))


def _pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1] if len(values) > 1 else values[0]


def run(direct: Side, proxied: Side, model: str, requests_n: int, streams_n: int) -> dict[str, Any]:
    for side in (direct, proxied):  # warm-up: connections, TLS session, the engine's first answer
        side.chat(model)
    latency: dict[str, list[float]] = {"direct": [], "proxy": []}
    for i in range(requests_n):
        order = (direct, proxied) if i % 2 == 0 else (proxied, direct)
        for side in order:
            latency[side.name].append(side.chat(model))
    tokens: dict[str, int] = {"direct": 0, "proxy": 0}
    seconds: dict[str, float] = {"direct": 0.0, "proxy": 0.0}
    for i in range(streams_n):
        order = (direct, proxied) if i % 2 == 0 else (proxied, direct)
        for side in order:
            n, s = side.stream(model)
            tokens[side.name] += n
            seconds[side.name] += s
    p50 = {k: statistics.median(v) * 1000 for k, v in latency.items()}
    p90 = {k: _pct(v, 90) * 1000 for k, v in latency.items()}
    rate = {k: tokens[k] / seconds[k] for k in tokens}
    return {"requests_each_way": requests_n, "streams_each_way": streams_n, "p50_ms": p50, "p90_ms": p90,
            "p50_overhead_ms": p50["proxy"] - p50["direct"], "tokens_per_s": rate,
            "stream_ratio": rate["proxy"] / rate["direct"]}


MAX_COUNT = 100_000


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_proxy", description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", default=DEFAULT_WORKDIR, help=f"the sandbox's workdir (default {DEFAULT_WORKDIR})")
    parser.add_argument("--requests", type=int, default=200, help="chat completions each way (default 200)")
    parser.add_argument("--streams", type=int, default=20, help="streamed completions each way (default 20)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--from-node", action="store_true", help=argparse.SUPPRESS)  # the part run on the head
    args = parser.parse_args(argv)
    # Each figure is a median, a percentile or a rate over these counts: none of them exists for zero.
    for flag, value in (("--requests", args.requests), ("--streams", args.streams)):
        if not 1 <= value <= MAX_COUNT:
            print(f"error: {flag} {value} is not between 1 and {MAX_COUNT:,}", file=sys.stderr)
            return 2
    if args.from_node:
        print(json.dumps(run(*_sides(json.loads(sys.stdin.read())), args.requests, args.streams)))
        return 0
    try:
        plan = _plan(Path(args.workdir).resolve())
    except (OSError, ValueError, AttributeError, KeyError, RuntimeError) as exc:  # a missing or foreign workdir
        print(f"error: no usable sandbox in {args.workdir} ({type(exc).__name__}: {str(exc)[:200]}): run "
              "kimi-cluster sandbox up first", file=sys.stderr)
        return 2
    result = _on_the_head(plan, args.requests, args.streams)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"{args.requests} chat completions and {args.streams} streams each way, interleaved, "
          f"from the head, direct {plan['direct']} vs proxy {plan['proxy']}")
    print(f"  latency p50: direct {result['p50_ms']['direct']:.2f} ms, proxy {result['p50_ms']['proxy']:.2f} ms, "
          f"overhead {result['p50_overhead_ms']:+.2f} ms")
    print(f"  latency p90: direct {result['p90_ms']['direct']:.2f} ms, proxy {result['p90_ms']['proxy']:.2f} ms")
    print(f"  streamed tokens/s: direct {result['tokens_per_s']['direct']:,.0f}, proxy "
          f"{result['tokens_per_s']['proxy']:,.0f}, ratio {result['stream_ratio']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
