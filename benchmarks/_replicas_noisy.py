"""bench_replicas --noisy: what two noisy neighbours cost the other clients of the front.

One client loops on a request the engine answers 500 (an image its engine cannot fetch, as vLLM 0.33.0 answers one:
kimi_cluster/fakes/inference/media.py), the other opens a stream and never reads it. The well-behaved load runs in
phases without them (quiet) and with them (noisy), `--rounds` times in turn, each phase `--phase` seconds; between
two phases every client stops and every answer is in, so each figure belongs to one phase.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import socket
import ssl
import statistics
import threading
import time
from typing import Any
from urllib.parse import urlsplit

import openai

from benchmarks._replicas_front import (
    engine_requests,
    layer_pid,
    process_memory,
    reset_peak,
    resume_log_lines,
    resume_log_sizes,
)
from benchmarks._replicas_load import FIRST_CHUNK, STREAM, WHOLE, Tally, client_for, run_load, write_ca
from kimi_cluster.fakes.node_fabric import FabricConfig
from kimi_cluster.sandbox.kimi import Sandbox

# Port 9 (discard) on the engine's own loopback: nothing listens there, so the fetch is refused and vLLM answers 500
# (an aiohttp ClientConnectorError, which its last-resort handler answers as an InternalServerError).
UNFETCHABLE_IMAGE = "http://127.0.0.1:9/kimi.png"
# The stream the stalled client asks for and never reads: the fake engine's longest answer (about 1,000 tokens).
STALLED_PROMPT = "Please count from 1 to 200."
STALLED_RCVBUF = 4096  # its receive buffer: small, so the front's side of the connection fills soon

# The resuming layer's log lines (kimi_cluster/node/resume): a request sent to a replica again, and a replica taken
# out of the pool (by a request's failure, or by its missed health checks).
SENT_AGAIN = ("; carrying on elsewhere", "sending it whole to another replica")
MARKED_DOWN, MISSED_CHECKS = " is down: ", "health checks missed in a row"
KINDS = (WHOLE, FIRST_CHUNK, STREAM)


class FiveHundreds:
    """The client that loops on a request the engine answers 500, one every `interval` seconds; it counts the
    answers it gets by status (what the front passed on: the engine's 500, or a 503 of its own)."""

    def __init__(self, client: openai.OpenAI, model: str, interval: float, stop: threading.Event) -> None:
        self.client, self.model, self.interval, self.stop = client, model, interval, stop
        self.answers: collections.Counter[str] = collections.Counter()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        content: Any = [{"type": "text", "text": "What is in this image?"},  # the SDK's TypedDicts, as plain JSON
                        {"type": "image_url", "image_url": {"url": UNFETCHABLE_IMAGE}}]
        while not self.stop.is_set():
            try:
                self.client.chat.completions.create(model=self.model, max_tokens=64,
                                                    messages=[{"role": "user", "content": content}])
                self.answers["200"] += 1
            except openai.APIStatusError as exc:
                self.answers[str(exc.status_code)] += 1
            except openai.OpenAIError as exc:
                self.answers[type(exc).__name__] += 1
            self.stop.wait(self.interval)


class StalledReader:
    """The client that opens a stream and reads nothing of it (not even the status line), with a small receive
    buffer, until the phase ends."""

    def __init__(self, base_url: str, key: str, ca: str, model: str) -> None:
        url = urlsplit(base_url)
        body = json.dumps({"model": model, "stream": True, "max_tokens": 4096,
                           "messages": [{"role": "user", "content": STALLED_PROMPT}]}).encode()
        raw = socket.socket()
        raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, STALLED_RCVBUF)
        raw.settimeout(30)
        raw.connect((url.hostname or "", url.port or 443))
        self.sock = ssl.create_default_context(cafile=ca).wrap_socket(raw, server_hostname=url.hostname)
        self.sock.sendall(f"POST {url.path.rstrip('/')}/chat/completions HTTP/1.1\r\nHost: {url.netloc}\r\n"
                          f"Authorization: Bearer {key}\r\nContent-Type: application/json\r\n"
                          f"Content-Length: {len(body)}\r\n\r\n".encode() + body)

    def close(self) -> None:
        self.sock.close()


def percentile(values: list[float], q: int) -> float | None:
    """The q-th percentile (1 to 99) of values, linearly between the two nearest (numpy's default); None if empty."""
    if len(values) < 2:
        return values[0] if values else None
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def log_counts(lines: list[str]) -> dict[str, int]:
    """The resuming layer's log lines of one phase, counted: requests it sent to a replica again, replicas a request
    marked down, and replicas their health checks marked down."""
    down = [line for line in lines if MARKED_DOWN in line]
    return {"sent_again": sum(1 for line in lines if any(m in line for m in SENT_AGAIN)),
            "marked_down_by_a_request": sum(1 for line in down if MISSED_CHECKS not in line),
            "marked_down_by_health_checks": sum(1 for line in down if MISSED_CHECKS in line)}


def run_phase(sandbox: Sandbox, outputs: dict[str, Any], ca: str, args: argparse.Namespace, noisy: bool,
              ) -> dict[str, Any]:
    """One phase: the well-behaved load for `--phase` seconds, with the neighbours if `noisy`, then everything
    stopped and read."""
    front = outputs["front_public_ip"]
    front_dir = sandbox.dir.nodes / front
    fabric = FabricConfig.load(sandbox.dir.root / "fabric.json")
    engine_port = int(sandbox.dir.record()["engine_port"])
    replicas = [f"http://{ip}:{engine_port}" for ip in outputs["replica_head_private_ips"]]
    base_url, key, model = outputs["openai_base_url"], outputs["api_key"], outputs["served_model_name"]
    counted_before = engine_requests(fabric, front, replicas)
    logs = resume_log_sizes(front_dir)
    pid = layer_pid(front_dir)
    peak_reset = pid is not None and reset_peak(pid)
    tally, stop = Tally(), threading.Event()
    five_hundreds = FiveHundreds(client_for(base_url, key, ca), model, args.noisy_interval, stop) if noisy else None
    stalled = StalledReader(base_url, key, ca, model) if noisy else None
    threads = run_load(base_url, key, ca, model, args.chats, stop, tally)
    time.sleep(args.phase)
    memory = process_memory(pid) if pid else {}  # before the stalled stream closes: what it holds counts
    stop.set()
    if stalled:
        stalled.close()
    deadline = time.monotonic() + 60
    for t in [*threads, *([five_hundreds.thread] if five_hundreds else [])]:
        t.join(max(0.0, deadline - time.monotonic()))
    counted = engine_requests(fabric, front, replicas)
    begun = [None if after is None or before is None else after - before
             for before, after in ((counted_before[u], counted[u]) for u in replicas)]
    return {
        "noisy": noisy, "seconds": args.phase, "requests": tally.requests, "streams_started": tally.streams_started,
        "streams_completed": tally.streams_done, "streams_cut": len(tally.streams_cut), "cut": tally.streams_cut[:5],
        "streams_refused": len(tally.stream_refused), "refused": tally.stream_refused[:5],
        "streams_hung": sum(1 for t in threads if t.is_alive()), "streams_wrong": len(tally.streams_wrong),
        "failed_non_streamed": len(tally.failed), "failures": tally.failed[:5],
        "sent_by_clients": tally.requests + tally.streams_started + (1 if stalled else 0),
        "engine_requests_begun": None if None in begun else sum(b for b in begun if b is not None),
        **log_counts(resume_log_lines(logs, "kimi-resume: ")),
        "layer_pid": pid, "layer_peak_reset": peak_reset, "layer_pid_after": layer_pid(front_dir),
        "layer_peak_kib": memory.get("VmHWM"), "layer_rss_kib": memory.get("VmRSS"),
        "five_hundreds_answers": dict(five_hundreds.answers) if five_hundreds else {},
        "latencies": {kind: tally.latencies.get(kind, []) for kind in KINDS},
    }


def measure_noisy(sandbox: Sandbox, args: argparse.Namespace) -> dict[str, Any]:
    """`--rounds` of a quiet phase then a noisy one; the figures of each kind of phase summed over the rounds."""
    outputs, _ = sandbox.outputs()
    ca = write_ca(outputs)
    try:
        phases = []
        for n in range(args.rounds):
            for noisy in (False, True):
                phases.append(run_phase(sandbox, outputs, ca, args, noisy))
                print(f"bench: round {n + 1} {'noisy' if noisy else 'quiet'}: {phases[-1]['requests']} requests, "
                      f"{phases[-1]['streams_started']} streams", flush=True)
    finally:
        os.unlink(ca)
    return {"chats": args.chats, "token_seconds": args.token_seconds, "phase_seconds": args.phase,
            "rounds": args.rounds, "noisy_interval_s": args.noisy_interval, "unfetchable_image": UNFETCHABLE_IMAGE,
            "quiet": summed([p for p in phases if not p["noisy"]]), "noisy": summed([p for p in phases if p["noisy"]])}


def summed(phases: list[dict[str, Any]]) -> dict[str, Any]:
    """One kind of phase over the rounds: counts added, latencies as percentiles of all, the peak memory the
    highest, the 5xx client's answers added."""
    out: dict[str, Any] = {}
    for key in ("requests", "streams_started", "streams_completed", "streams_cut", "streams_refused", "streams_hung",
                "streams_wrong", "failed_non_streamed", "sent_by_clients", "sent_again", "marked_down_by_a_request",
                "marked_down_by_health_checks"):
        out[key] = sum(p[key] for p in phases)
    begun = [p["engine_requests_begun"] for p in phases]
    out["engine_requests_begun"] = None if None in begun else sum(begun)
    for key in ("cut", "refused", "failures"):
        out[key] = [x for p in phases for x in p[key]][:10]
    peaks = [p["layer_peak_kib"] for p in phases if p["layer_peak_kib"] is not None]
    out["layer_peak_kib"] = max(peaks) if peaks else None
    out["layer_rss_kib"] = max((p["layer_rss_kib"] for p in phases if p["layer_rss_kib"] is not None), default=None)
    out["layer_peak_reset"] = all(p["layer_peak_reset"] for p in phases)
    out["layer_restarted"] = any(p["layer_pid"] != p["layer_pid_after"] for p in phases)
    answers: collections.Counter[str] = collections.Counter()
    for p in phases:
        answers.update(p["five_hundreds_answers"])
    out["five_hundreds_answers"] = dict(sorted(answers.items()))
    for kind in KINDS:
        values = [x for p in phases for x in p["latencies"][kind]]
        out[kind] = {"count": len(values), "p50_s": _rounded(percentile(values, 50)),
                     "p95_s": _rounded(percentile(values, 95))}
    return out


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


HOW = """how each figure is taken:
  streams, failures, latencies: the well-behaved clients' own (the openai SDK, its retries off). A stream is cut
    when it ends in an error after its first chunk, refused when before it; hung if still open 60 s after its
    phase. Latency: from the send to the whole answer (non-streamed), to the first chunk and to the last (streams).
  sent again: the resuming layer's own log (resume.log on the front), lines written during the phase: a generation
    carried on on another replica, a non-streamed request sent whole to another one.
  marked down: the same log: a replica taken out of the pool by a request's failure, or by missed health checks.
  engine arrivals: the replicas' /metrics counter {counter}, read from the front before
    and after each phase (the fake engines count a request when they begin to answer it, a refused one not at
    all), less the requests the clients sent (the stalled stream's included; the 5xx client's not, as its engine
    refuses each): more than 0 is requests an engine began twice, less than 0 requests that reached no engine.
  peak memory: VmHWM of the kimi-resume unit's process (/proc/<MainPID>/status on the front), its peak set back
    to its size at each phase's start (/proc/<pid>/clear_refs: 5), read at the phase's end, the stalled stream
    still open; the highest phase's. The stalled stream asks for the fake engine's longest answer (about 1,000
    tokens): what the layer queues for it is bounded by that here, whatever its own bound.
  ratio: noisy / quiet; the goal is at most 1.1."""


def format_noisy(f: dict[str, Any]) -> str:
    from benchmarks._replicas_front import REQUESTS_COUNTER

    q, n = f["quiet"], f["noisy"]

    def both(render: Any) -> str:
        return f"{render(q):>16} {render(n):>16}"

    def mib(kib: int | None) -> str:
        return "?" if kib is None else f"{kib / 1024:.1f}"

    def ratio(kind: str, at: str) -> str:
        a, b = q[kind][at], n[kind][at]
        return "?" if not a or b is None else f"{b / a:.2f}"

    def arrivals(p: dict[str, Any]) -> str:
        begun = p["engine_requests_begun"]
        return "?" if begun is None else f"{begun - p['sent_by_clients']:+d}"

    answers = ", ".join(f"{status} x {count}" for status, count in n["five_hundreds_answers"].items()) or "none"
    lines = [
        f"noisy neighbours: {f['chats']} well-behaved chats, {f['token_seconds'] * 1000:.0f} ms a token; "
        f"{f['rounds']} round(s) of {f['phase_seconds']:g} s quiet then {f['phase_seconds']:g} s noisy",
        f"  the neighbours: a client asking every {f['noisy_interval_s']:g} s about an image at "
        f"{f['unfetchable_image']}",
        "  (its engine cannot fetch it: vLLM answers 500), and one that opens a stream and reads nothing of it",
        f"{'':<52} {'quiet':>16} {'noisy':>16} {'noisy/quiet':>12}",
        f"{'non-streamed requests / streams started':<52} "
        + both(lambda p: f"{p['requests']} / {p['streams_started']}"),
        f"{'streams cut / refused / hung / wrong':<52} "
        + both(lambda p: f"{p['streams_cut']} / {p['streams_refused']} / {p['streams_hung']} / {p['streams_wrong']}"),
        f"{'non-streamed requests failed':<52} " + both(lambda p: str(p["failed_non_streamed"])),
        f"{'requests the layer sent again (its log)':<52} " + both(lambda p: str(p["sent_again"])),
        f"{'replicas marked down: by a request / by checks':<52} "
        + both(lambda p: f"{p['marked_down_by_a_request']} / {p['marked_down_by_health_checks']}"),
        f"{'engine arrivals less requests sent':<52} " + both(arrivals),
    ]
    for kind in KINDS:
        lines.append(f"{kind + ' p50 / p95, s':<52} "
                     + both(lambda p, k=kind: f"{p[k]['p50_s']} / {p[k]['p95_s']}")
                     + f" {ratio(kind, 'p50_s') + ' / ' + ratio(kind, 'p95_s'):>12}")
    lines += [
        f"{'resuming layer memory: peak (VmHWM) / at the end, MiB':<52} "
        + both(lambda p: f"{mib(p['layer_peak_kib'])} / {mib(p['layer_rss_kib'])}")
        + ("" if q["layer_peak_reset"] and n["layer_peak_reset"] else "  (peak not reset: since its start)")
        + ("  (the layer restarted during a phase)" if q["layer_restarted"] or n["layer_restarted"] else ""),
        f"{'the 5xx client: answers by status':<52} {'':>16} {answers}",
    ]
    for name, p in (("quiet", q), ("noisy", n)):
        lines += [f"  {name} failed: {x}" for x in p["failures"]] + [f"  {name} cut: {x}" for x in p["cut"]]
        lines += [f"  {name} refused: {x}" for x in p["refused"]]
    return "\n".join(lines + [HOW.format(counter=REQUESTS_COUNTER)])
