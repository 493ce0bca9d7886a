"""Lose a replica under load: N concurrent chats through the front, one replica's head reclaimed in the middle.

    python -m benchmarks.bench_replicas [--topology b300x1-vllm] [--chats 16] [--token-seconds 0.02]
                                        [--before 6] [--after 12] [--lose delete|unreachable] [--json]
                                        [--workdir .sandbox-bench-replicas]

Brings up a 2-replica sandbox (FAKE_ENGINE_TOKEN_SECONDS paces every answer, so requests are in flight), runs
`--chats` workers through the official `openai` client against the front (TLS with the stack's CA, the stack's key,
the client's own retries off: what the front delivers is what is counted). Half the workers make tool-call round
trips (a non-streamed request that calls a tool, the tool's result sent back, the final answer), half stream. After
`--before` seconds the head of replica 1 is lost (`sandbox reclaim`: the emulator deletes the VM and its node is gone,
or with `--lose unreachable` every packet to and from it is dropped); the load goes on for `--after` seconds. Then it
prints:

- failed non-streamed requests (each with the client's error);
- streams started, completed and cut (a cut stream ends with an error; one still open when the load stops hangs),
  and those whose assembled message differs from the first of their kind (`streams_wrong`);
- `longest_resume_gap_s`: of the streams open at the loss, the longest wait for a chunk from the loss on (across the
  cut: a stream carried on on the twin waits for its first chunk from there);
- generations the front's resuming layer carried on on the twin (its log);
- tool-call round trips completed of those started;
- seconds from the reclaim until the front sent its last request to the lost replica. An observer takes the lost
  replica's address and engine port the moment its VM is gone and records every request line that reaches it from
  the front's private address (any other sender is listed apart); the front's active health probes (GET /health)
  are counted apart. A silent replica has no observer: the front's own
  log of failed tries says when it stopped trying.
"""

from __future__ import annotations

import argparse
import io
import itertools
import json
import os
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai

from benchmarks._args import interrupt_on_sigterm, number_problem, workdir_problem
from kimi_cluster.checks.tools import TOOL_IMPLS, TOOLS
from kimi_cluster.fakes.node_fabric import Fabric, FabricConfig
from kimi_cluster.sandbox.kimi import TOPOLOGIES, Sandbox

TOOL_TASK = "What is the weather in Tokyo? Use the tool."


@dataclass
class Tally:
    """What the workers saw, under one lock."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    requests: int = 0
    failed: list[str] = field(default_factory=list)
    streams_started: int = 0
    streams_done: int = 0
    streams_cut: list[str] = field(default_factory=list)
    stream_refused: list[str] = field(default_factory=list)
    trips_started: int = 0
    trips_done: int = 0
    open_streams: int = 0
    streams_wrong: list[str] = field(default_factory=list)
    # The first completed stream of each kind, which every later one must equal (the fake engines answer a prompt
    # the same way every time): a stream carried on on the twin must come out whole, no token twice or lost.
    reference: dict[str, Any] = field(default_factory=dict)
    loss_at: float | None = None  # when the replica was lost (time.monotonic)
    # For each completed stream that was open at the loss: the longest its client waited for a chunk from the loss
    # on, the wait across the cut included (from its last chunk before the loss), in seconds. Keep-alive comments
    # are not chunks: the SDK skips them. The replica goes some milliseconds after `loss_at` (the reclaim's own
    # time), so the wait is measured between chunks, never from `loss_at`, which would leave that time out.
    resume_gaps: list[float] = field(default_factory=list)

    def add(self, **counts: int) -> None:
        with self.lock:
            for key, n in counts.items():
                setattr(self, key, getattr(self, key) + n)

    def note(self, which: str, text: str) -> None:
        with self.lock:
            getattr(self, which).append(text)

    def check(self, kind: str, got: Any, times: list[float], started: float) -> None:
        """A completed stream: as the first of its kind, and its longest chunk gap if it was open at the loss."""
        with self.lock:
            expected = self.reference.setdefault(kind, got)
            if got != expected:
                self.streams_wrong.append(f"{kind}: {str(got)[:200]} instead of {str(expected)[:200]}")
            if self.loss_at is not None and started < self.loss_at < times[-1]:
                stamps = [started, *times]
                self.resume_gaps.append(max(b - a for a, b in itertools.pairwise(stamps) if b > self.loss_at))


# The observer's listener, run inside a namespace that takes the lost replica's address: one line per connection,
# its arrival time (CLOCK_MONOTONIC, the same clock in every process of this machine), the peer's address and its
# request line. A thread per connection, so one slow client cannot hold the others in the backlog until they give up
# (which would show as a connection with no request line at a late time).
_LISTENER = """
import socket, sys, threading, time
lock = threading.Lock()
def serve(conn, peer, at):
    data = b""
    with conn:
        conn.settimeout(5)
        try:
            while b"\\r\\n" not in data and len(data) < 4096:
                chunk = conn.recv(4096)
                if not chunk:
                    break
                data += chunk
        except OSError:
            pass
    line = data.split(b"\\r\\n", 1)[0].decode(errors="replace") or "(no request line)"
    with lock:
        print(at, peer[0], line, flush=True)
sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
sock.bind((sys.argv[1], int(sys.argv[2])))
sock.listen(64)
print("listening", flush=True)
while True:
    conn, peer = sock.accept()
    threading.Thread(target=serve, args=(conn, peer, time.monotonic()), daemon=True).start()
"""


class Observer:
    """Takes the lost replica's address (a bare namespace on the fake nodes' bridge, once its VM's is gone) and its
    engine port, records each request line that reaches it with its time and its sender, and hangs up."""

    def __init__(self, fabric: Fabric, host: str, port: int) -> None:
        self.seen: list[tuple[float, str, str]] = []
        self.fabric = fabric
        self.namespace = fabric.attach(host)
        self.proc = subprocess.Popen(["ip", "netns", "exec", self.namespace, sys.executable, "-c", _LISTENER, host,
                                      str(port)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        assert self.proc.stdout is not None
        if self.proc.stdout.readline().strip() != "listening":
            raise RuntimeError(f"the observer could not listen on {host}:{port}")
        self.bound_at = time.monotonic()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            at, peer, request = line.rstrip("\n").split(" ", 2)
            self.seen.append((float(at), peer, request))

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait(10)
        self.thread.join(2)
        self.fabric.end_namespace(self.namespace)


def _client(base_url: str, key: str, ca_file: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=60,
                         http_client=openai.DefaultHttpxClient(verify=ssl.create_default_context(cafile=ca_file)))


def _round_trip(client: openai.OpenAI, model: str, tally: Tally) -> None:
    """One tool-call round trip: ask, run the tool the model calls, send its result, read the answer."""
    tally.add(trips_started=1)
    messages: list[Any] = [{"role": "user", "content": TOOL_TASK}]
    for _ in range(4):
        tally.add(requests=1)
        try:
            # TOOLS is plain JSON shared with the endpoint checks; the SDK types it as its own TypedDicts.
            reply = client.chat.completions.create(model=model, messages=messages, tools=TOOLS,  # type: ignore[arg-type]
                                                   max_tokens=256)
        except openai.OpenAIError as exc:
            tally.note("failed", f"{type(exc).__name__}: {str(exc)[:160]}")
            return
        message = reply.choices[0].message
        if not message.tool_calls:
            tally.add(trips_done=1)
            return
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls:
            function = getattr(call, "function", None)  # a custom tool call has none
            name = getattr(function, "name", "")
            args = json.loads(function.arguments) if function is not None and name in TOOL_IMPLS else {}
            result = TOOL_IMPLS[name](**args) if name in TOOL_IMPLS else {"error": "unknown tool"}
            messages.append({"role": "tool", "tool_call_id": call.id, "content": json.dumps(result)})
    tally.note("failed", "tool round trip: still calling tools after 4 turns")


def _stream(client: openai.OpenAI, model: str, tally: Tally, tools: bool) -> None:
    """One streamed turn, assembled: plain text, or (tools) reasoning and a tool call, each tool call's id the
    same in every chunk that names one."""
    chunks, times, started = 0, [], time.monotonic()
    text: dict[str, str] = {"content": "", "reasoning": ""}
    calls: dict[int, dict[str, Any]] = {}
    finish = None
    tally.add(streams_started=1, open_streams=1)
    try:
        stream = client.chat.completions.create(  # type: ignore[call-overload]  # TOOLS is plain JSON
            model=model, stream=True, max_tokens=256,
            messages=[{"role": "user", "content": TOOL_TASK if tools else "Tell me about Kimi."}],
            **({"tools": TOOLS} if tools else {}))
        for chunk in stream:
            chunks += 1
            times.append(time.monotonic())
            for choice in chunk.choices:
                delta = choice.delta
                text["content"] += delta.content or ""
                text["reasoning"] += (delta.model_extra or {}).get("reasoning") or ""
                for call in delta.tool_calls or []:
                    slot = calls.setdefault(call.index, {"ids": set(), "name": "", "arguments": ""})
                    slot["ids"] |= {call.id} if call.id else set()
                    if call.function is not None:
                        slot["name"] += call.function.name or ""
                        slot["arguments"] += call.function.arguments or ""
                finish = choice.finish_reason or finish
        tally.add(streams_done=1)
        got = (text["content"], text["reasoning"], finish,
               [(c["name"], c["arguments"], len(c["ids"])) for _, c in sorted(calls.items())])
        tally.check("tool-call stream" if tools else "stream", got, times or [started], started)
    except openai.OpenAIError as exc:
        # Before the first chunk the front could still have sent it elsewhere: that one is a refused request.
        which = "streams_cut" if chunks else "stream_refused"
        tally.note(which, f"after {chunks} chunks: {type(exc).__name__}: {str(exc)[:160]}")
    finally:
        tally.add(open_streams=-1)


def run_load(base_url: str, key: str, ca_file: str, model: str, chats: int, stop: threading.Event,
             tally: Tally) -> list[threading.Thread]:
    def worker(index: int) -> None:
        client = _client(base_url, key, ca_file)
        while not stop.is_set():
            if index % 2 == 0:
                _round_trip(client, model, tally)
            else:  # every other stream worker streams a tool call with its reasoning
                _stream(client, model, tally, tools=index % 4 == 3)

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(chats)]
    for t in threads:
        t.start()
    return threads


# Beyond these the figures mean nothing: more chats than the fake engines' slots, a decode slower than a second a
# token, or a load phase longer than an hour.
MAX_CHATS, MAX_TOKEN_SECONDS, MAX_PHASE_SECONDS = 256, 1.0, 3600.0


def _usage_problem(args: argparse.Namespace, workdir: Path) -> str | None:
    if not 1 <= args.chats <= MAX_CHATS:
        return f"--chats {args.chats} is not between 1 and {MAX_CHATS}"
    return (number_problem("--token-seconds", args.token_seconds, 0, MAX_TOKEN_SECONDS)
            or number_problem("--before", args.before, 0, MAX_PHASE_SECONDS)
            or number_problem("--after", args.after, 0, MAX_PHASE_SECONDS)
            or workdir_problem(workdir) or _rolling_problem(args) or _render_server_problem(args))


def _render_server_problem(args: argparse.Namespace) -> str | None:
    """The front's render server needs a real vLLM: said before the bring-up, as `sandbox up` says it."""
    from kimi_cluster.sandbox.nodes import render_server_problem, stack_settings
    from kimi_cluster.settings import SettingsError

    try:
        return render_server_problem(stack_settings(args.topology, {"replicas": "2"}))
    except SettingsError:  # a shape the bring-up itself refuses, naming the key
        return None


def _rolling_problem(args: argparse.Namespace) -> str | None:
    """--rolling's image, checked as the stack's `up` will check it: before the first bring-up, not after it."""
    if args.rolling is None:
        return None
    from kimi_cluster.sandbox.nodes import stack_settings
    from kimi_cluster.settings import SettingsError

    try:
        stack_settings(args.topology, {"replicas": "2", "image": args.rolling})
    except SettingsError as err:
        lines = [line.strip() for line in str(err).splitlines()[1:] if line.strip()]
        return f"--rolling: {'; '.join(lines) or err}"
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench_replicas", description=__doc__.splitlines()[0])
    ap.add_argument("--topology", choices=TOPOLOGIES, default="b300x1-vllm")
    ap.add_argument("--chats", type=int, default=16, help="concurrent chats (half tool round trips, half streams)")
    ap.add_argument("--token-seconds", type=float, default=0.02, help="the fake engines' decode time per token")
    ap.add_argument("--before", type=float, default=6.0, help="seconds of load before the reclaim")
    ap.add_argument("--after", type=float, default=12.0, help="seconds of load after it")
    ap.add_argument("--lose", choices=["delete", "unreachable"], default="delete",
                    help="how replica 1's head goes: its VM deleted (the address answers nothing: a reset at once) "
                         "or unreachable (still ACTIVE, every packet dropped, as a lost cloud host usually is)")
    ap.add_argument("--workdir", default=".sandbox-bench-replicas")
    ap.add_argument("--keep", action="store_true", help="leave the sandbox up afterwards")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    ap.add_argument("--no-kernel-cache", action="store_true",
                    help="deploy without the sandbox's kernel-cache bucket and its steps (they do not change what "
                         "is measured here)")
    ap.add_argument("--rolling", metavar="IMAGE",
                    help="instead of a reclaim: change the engine image to IMAGE with `up` under the load, and count "
                         "what fails while the replicas restart one after the other")
    args = ap.parse_args(argv)
    workdir = Path(args.workdir).resolve()
    problem = _usage_problem(args, workdir)
    if problem:  # before the bring-up, which takes minutes
        print(f"error: {problem}", file=sys.stderr)
        return 2
    os.environ["FAKE_ENGINE_TOKEN_SECONDS"] = str(args.token_seconds)  # reaches the engines through the nodes' env
    log = io.StringIO()
    interrupt_on_sigterm()  # a `timeout` or a closed terminal still destroys the sandbox
    sandbox = Sandbox(workdir, out=log)
    print(f"bench: 2 x {args.topology} behind a front in {workdir}; {args.chats} chats, "
          f"{args.token_seconds * 1000:.0f} ms per token", flush=True)
    started = time.monotonic()
    try:
        if sandbox.up(args.topology, echo=False, config={"replicas": "2"}, timeline=False,
                      kernel_cache=False if args.no_kernel_cache else None) != 0:
            raise SystemExit(f"sandbox up failed:\n{log.getvalue()[-3000:]}")
        print(f"bench: up in {time.monotonic() - started:.1f} s", flush=True)
        figures = measure_rolling(sandbox, args) if args.rolling else measure(sandbox, args, log)
    finally:
        if not args.keep:
            sandbox.destroy(echo=False)
    if args.json:
        print(json.dumps(figures, indent=2))
    else:
        print(format_rolling(figures) if args.rolling else format_figures(figures))
    return 0


def start_load(outputs: dict[str, Any], args: argparse.Namespace,
               ) -> tuple[str, Tally, threading.Event, list[threading.Thread]]:
    """The load both measurements run under: `--chats` workers through the front, trusting the stack's CA (written
    to a file the caller removes), running for `--before` seconds before this returns. Returns the CA file's path,
    the tally, the event that stops the workers, and their threads."""
    with tempfile.NamedTemporaryFile("w", suffix=".pem", delete=False) as ca:
        ca.write(outputs["ca_certificate"])
    tally, stop = Tally(), threading.Event()
    threads = run_load(outputs["openai_base_url"], outputs["api_key"], ca.name, outputs["served_model_name"],
                       args.chats, stop, tally)
    time.sleep(args.before)
    return ca.name, tally, stop, threads


def measure(sandbox: Sandbox, args: argparse.Namespace, log: io.StringIO) -> dict[str, Any]:
    outputs, _ = sandbox.outputs()
    lost = outputs["replica_node_names"][1][0]
    lost_ip = outputs["replica_head_private_ips"][1]
    engine_port = int(sandbox.dir.record()["engine_port"])
    ca, tally, stop, threads = start_load(outputs, args)
    fabric = FabricConfig.load(sandbox.dir.root / "fabric.json")
    # The reclaim waits (up to a minute) for a stream generating on the lost replica, so that one is carried on.
    generating = generations_on(fabric, outputs["front_public_ip"], f"http://{lost_ip}:{engine_port}", 60.0)
    before = {"requests": tally.requests, "streams": tally.streams_started, "in_flight_streams": tally.open_streams}
    reclaimed_at, reclaimed_wall = time.monotonic(), time.time()
    tally.loss_at = reclaimed_at
    sandbox.reclaim(lost, args.lose)
    # A deleted VM's address is free: the observer takes it. A silent one keeps it, and drops what reaches it.
    observer = Observer(Fabric(fabric), lost_ip, engine_port) \
        if args.lose == "delete" else None
    where = f"observer on {lost_ip}:{engine_port} after {observer.bound_at - reclaimed_at:.2f} s" if observer \
        else "no observer: its packets are dropped"
    print(f"bench: {log.getvalue().strip().splitlines()[-1]}; {where}", flush=True)
    time.sleep(args.after)
    stop.set()
    deadline = time.monotonic() + 60
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    hung = sum(1 for t in threads if t.is_alive())
    seen = observer.seen if observer else []
    if observer:
        observer.close()
    os.unlink(ca)
    # Only what the front sends counts: the observer's address is a bare namespace, with no firewall of its own.
    front, health = outputs["front_private_ip"], ("GET /health", "HEAD /health")
    proxied = [(t - reclaimed_at, line) for t, peer, line in seen if peer == front and not line.startswith(health)]
    probes = [t - reclaimed_at for t, peer, line in seen if peer == front and line.startswith(health)]
    elsewhere = [f"{t - reclaimed_at:.2f} s from {peer}: {line[:80]}" for t, peer, line in seen if peer != front]
    front_dir = sandbox.dir.nodes / outputs["front_public_ip"]
    tried = front_tries(front_dir, f"{lost_ip}:{engine_port}", reclaimed_wall)
    carried = resume_log_lines(resume_log_sizes(front_dir, empty=True), ": carried on by ")
    return {
        "front_log_last_try_s": round(max(tried, default=0.0), 2), "front_log_tries": len(tried),
        "lost_replica_head": lost, "lost_as": args.lose, "chats": args.chats, "token_seconds": args.token_seconds,
        "requests": tally.requests, "requests_before_reclaim": before["requests"],
        "streams_in_flight_at_reclaim": before["in_flight_streams"],
        "failed_non_streamed": len(tally.failed), "failures": tally.failed[:10],
        "streams_started": tally.streams_started, "streams_completed": tally.streams_done,
        "streams_cut": len(tally.streams_cut), "cut": tally.streams_cut[:10],
        "streams_refused_before_first_chunk": len(tally.stream_refused), "refused": tally.stream_refused[:10],
        "streams_hung": hung, "streams_wrong": len(tally.streams_wrong), "wrong": tally.streams_wrong[:10],
        "streams_open_at_loss_completed": len(tally.resume_gaps),
        "generating_on_lost_replica_at_reclaim": generating,
        "carried_on_by_the_twin": len(carried), "carried": carried[:10],
        "longest_resume_gap_s": round(max(tally.resume_gaps, default=0.0), 2),
        "tool_round_trips_started": tally.trips_started, "tool_round_trips_completed": tally.trips_done,
        "requests_reaching_lost_replica_after_reclaim": len(proxied),
        "seconds_until_front_sends_nothing_more": round(max((t for t, _ in proxied), default=0.0), 2),
        "health_probes_to_lost_replica": len(probes),
        "reaching_lost_replica": [f"{t:.2f} s: {line[:80]}" for t, line in proxied[:10]],
        "connections_from_elsewhere": elsewhere[:10],
    }


def measure_rolling(sandbox: Sandbox, args: argparse.Namespace) -> dict[str, Any]:
    """Load through the front while `up` rolls a new image over the replicas; what failed, and in which order the
    replicas restarted (from the steps' own marks in the state)."""
    from kimi_cluster.operator.timeline_report import bars_from_state

    outputs, _ = sandbox.outputs()
    # The front's resuming layer logs each stream it passes through unresumed: those from the roll on count.
    resume_logs = resume_log_sizes(sandbox.dir.nodes / outputs["front_public_ip"])
    ca, tally, stop, threads = start_load(outputs, args)
    before = tally.requests
    started = time.monotonic()
    code = sandbox.up(None, echo=False, config={"replicas": "2", "image": args.rolling}, timeline=False)
    took = time.monotonic() - started
    time.sleep(args.after)
    stop.set()
    for t in threads:
        t.join(60)
    os.unlink(ca)
    with sandbox.state_document() as state:
        bars = bars_from_state(json.loads(state.read_text()))
    order = [(b.label, b.step, b.start.timestamp(), b.end.timestamp() if b.end else None) for b in bars
             if b.step in ("launch", "engine-ready")]
    unresumed = [line.split("a stream not resumed: ", 1)[1]
                 for line in resume_log_lines(resume_logs, "a stream not resumed: ")]
    return {"image": args.rolling, "up_exit": code, "up_seconds": round(took, 1), "chats": args.chats,
            "requests": tally.requests, "requests_before_up": before,
            "failed_non_streamed": len(tally.failed), "failures": tally.failed[:10],
            "streams_started": tally.streams_started, "streams_completed": tally.streams_done,
            "streams_cut": len(tally.streams_cut), "cut": tally.streams_cut[:10],
            "streams_refused_before_first_chunk": len(tally.stream_refused), "refused": tally.stream_refused[:10],
            "streams_wrong": len(tally.streams_wrong), "wrong": tally.streams_wrong[:10],
            "streams_not_resumed": len(unresumed), "not_resumed": unresumed[:10], "resume_logs_read": len(resume_logs),
            "tool_round_trips_started": tally.trips_started, "tool_round_trips_completed": tally.trips_done,
            "restart_order": sorted(order, key=lambda o: o[2])}


def format_rolling(f: dict[str, Any]) -> str:
    t0 = min((o[2] for o in f["restart_order"]), default=0.0)
    lines = [
        f"rolling image change to {f['image']}: up exit {f['up_exit']} in {f['up_seconds']} s, under {f['chats']} "
        "chats",
        f"{'non-streamed requests through the front':<52} {f['requests']}",
        f"{'failed non-streamed requests':<52} {f['failed_non_streamed']}",
        f"{'streams: started / completed / cut / refused':<52} {f['streams_started']} / {f['streams_completed']} / "
        f"{f['streams_cut']} / {f['streams_refused_before_first_chunk']}",
        f"{'streams not as the first of their kind':<52} {f['streams_wrong']}",
        f"{'streams the front passed through unresumed':<52} {f['streams_not_resumed']}",
        f"{'tool-call round trips completed / started':<52} {f['tool_round_trips_completed']} / "
        f"{f['tool_round_trips_started']}",
        "restart order (s from the first launch):",
    ]
    lines += [f"  {label:<18} {step:<13} {start - t0:7.1f} -> {'' if end is None else f'{end - t0:.1f}'}"
              for label, step, start, end in f["restart_order"]]
    lines += [f"  failed: {x}" for x in f["failures"]] + [f"  cut: {x}" for x in f["cut"]]
    lines += [f"  wrong: {x}" for x in f["wrong"]]
    lines += [f"  refused: {x}" for x in f["refused"]] + [f"  not resumed: {x}" for x in f["not_resumed"]]
    return "\n".join(lines)


# Run inside the front's namespace (the resuming layer listens on the front's loopback only), asking until the
# replica has a generation or the wait is over: one process for the whole wait, not one per question.
_GENERATIONS = """
import json, sys, time, urllib.request
port, replica, deadline = int(sys.argv[1]), sys.argv[2], time.monotonic() + float(sys.argv[3])
while True:
    with urllib.request.urlopen("http://127.0.0.1:%d/health" % port, timeout=5) as answer:
        count = json.loads(answer.read()).get("generating", {}).get(replica, 0)
    if count or time.monotonic() >= deadline:
        print(count)
        break
    time.sleep(0.05)
"""


def generations_on(fabric: FabricConfig, front: str, replica_url: str, wait_s: float) -> int:
    """The generations the front's resuming layer runs on `replica_url`, asked until there is one or wait_s has
    passed (0 without a resuming layer: SGLang, or resumeStreams off)."""
    from kimi_cluster.settings import RESUME_PORT

    done = subprocess.run(["ip", "netns", "exec", fabric.namespace(front), sys.executable, "-c", _GENERATIONS,
                           str(RESUME_PORT), replica_url, str(wait_s)], capture_output=True, text=True,
                          timeout=wait_s + 30)
    if done.returncode != 0:
        return 0  # nothing listens there: no resuming layer
    return int(done.stdout.strip() or 0)


def resume_log_sizes(front_dir: Path, empty: bool = False) -> dict[Path, int]:
    """The front's resuming-layer log (kimi_cluster/node/resume logs to /var/log/kimi-cluster/resume.log), each with
    its size now, or 0 with `empty`: what resume_log_lines reads from."""
    return {p: 0 if empty else p.stat().st_size for p in front_dir.glob("**/kimi-cluster/resume.log")}


def resume_log_lines(since: dict[Path, int], marker: str) -> list[str]:
    """The lines holding `marker` written to each log after the size `since` gives it."""
    return [line for path, size in since.items()
            for line in path.read_bytes()[size:].decode(errors="replace").splitlines() if marker in line]


def front_tries(front_dir: Path, upstream: str, since: float) -> list[float]:
    """Seconds after `since` at which the front's Caddy logged a proxied request to `upstream` failing (its log is
    JSON lines; the active health checker's own lines are left out: it keeps probing a lost replica on purpose)."""
    log = front_dir / "var/lib/fake-node/docker/containers/kimi-proxy.log"
    out = []
    for line in log.read_text(errors="replace").splitlines() if log.exists() else []:
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if (isinstance(entry, dict) and upstream in (entry.get("upstream"), entry.get("host"))
                and "health_checker" not in str(entry.get("logger")) and float(entry.get("ts") or 0) >= since):
            out.append(float(entry["ts"]) - since)
    return out


def format_figures(f: dict[str, Any]) -> str:
    lines = [
        f"lost replica head: {f['lost_replica_head']} ({f['lost_as']}, after {f['requests_before_reclaim']} requests, "
        f"{f['streams_in_flight_at_reclaim']} streams in flight)",
        f"{'non-streamed requests through the front':<52} {f['requests']}",
        f"{'failed non-streamed requests':<52} {f['failed_non_streamed']}",
        f"{'streams: started / completed / cut / refused / hung':<52} {f['streams_started']} / "
        f"{f['streams_completed']} / {f['streams_cut']} / {f['streams_refused_before_first_chunk']} / "
        f"{f['streams_hung']}",
        f"{'streams not as the first of their kind':<52} {f['streams_wrong']}",
        f"{'longest wait for a chunk from the loss on, s':<52} {f['longest_resume_gap_s']} "
        f"(over {f['streams_open_at_loss_completed']} streams open at the loss that completed)",
        f"{'generations the front carried on on the twin':<52} {f['carried_on_by_the_twin']} "
        f"({f['generating_on_lost_replica_at_reclaim']} generating on the lost replica at the reclaim)",
        f"{'tool-call round trips completed / started':<52} {f['tool_round_trips_completed']} / "
        f"{f['tool_round_trips_started']}",
        f"{'seconds until the front sends nothing more to it':<52} {f['seconds_until_front_sends_nothing_more']} "
        f"({f['requests_reaching_lost_replica_after_reclaim']} requests reached it after the reclaim; "
        f"{f['health_probes_to_lost_replica']} health probes)",
        f"{'last failed try the front logged for it, s':<52} {f['front_log_last_try_s']} "
        f"({f['front_log_tries']} failed tries in the front's log after the reclaim)",
    ]
    lines += [f"  failed: {x}" for x in f["failures"]]
    lines += [f"  cut: {x}" for x in f["cut"]] + [f"  wrong: {x}" for x in f["wrong"]]
    lines += [f"  refused: {x}" for x in f["refused"]]
    lines += [f"  reached the lost replica at {x}" for x in f["reaching_lost_replica"]]
    lines += [f"  not from the front, at {x}" for x in f["connections_from_elsewhere"]]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
