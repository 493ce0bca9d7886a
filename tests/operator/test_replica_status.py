"""The status of replicas behind a front: the front's own view of each replica, taken by the probe it runs."""

from __future__ import annotations

import http.server
import socket
import subprocess
import threading
from collections.abc import Iterator

import pytest

from kimi_cluster.operator.stack_state import Connection, NodeRecord, StackState
from kimi_cluster.operator.status_replicas import format_replicas, front_view, replicas_view

METRICS = 'vllm:request_success_total{finished_reason="stop"} 7\nvllm:prompt_tokens_total 120\n' \
          "vllm:generation_tokens_total 340\n"


class LocalRunner:
    """Runs the command here, as the sandbox's node setting does: the probe is real, only SSH is left out."""

    def run(self, connection: Connection, command: str, stdin: str, timeout: float) -> tuple[int, str, str]:
        done = subprocess.run(["bash", "-c", command], input=stdin, capture_output=True, text=True, timeout=timeout)
        return done.returncode, done.stdout, done.stderr


class _Engine(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = METRICS.encode() if self.path == "/metrics" else b"{}"
        self.send_response(200 if self.path in ("/health", "/metrics") else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def upstreams() -> Iterator[list[str]]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Engine)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    with socket.socket() as s:  # a port nothing listens on: the lost replica
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    yield [f"127.0.0.1:{server.server_address[1]}", f"127.0.0.1:{dead}"]
    server.shutdown()


def test_the_front_sees_one_replica_serving_and_the_other_down(upstreams: list[str]):
    view = front_view(LocalRunner(), Connection("127.0.0.1", "root"), upstreams)
    assert view[0]["health"] == "ok" and view[0]["requests"] == 7 and view[0]["generation_tokens"] == 340
    assert view[1]["health"].startswith("down (URLError") and "requests" not in view[1]


def test_replicas_view_groups_nodes_and_prints_the_fronts_view(upstreams: list[str]):
    ips = [u.split(":")[0] for u in upstreams]
    port = int(upstreams[0].split(":")[1])
    state = StackState(stack="s", outputs={
        "front_public_ip": "127.0.0.9", "replica_node_names": [["a-node0"], ["a-r1-node0"]],
        "replica_head_private_ips": ips}, nodes=[
        NodeRecord(0, "a-front", "9", "127.0.0.9", "127.0.0.9", Connection("127.0.0.9", "root"))])
    nodes = [{"name": "a-node0", "vm": {"status": "ACTIVE"}, "engine": {"state": "running"}},
             {"name": "a-r1-node0", "vm": {"status": "gone (404)"}, "engine": None}]
    view = replicas_view(state, nodes, LocalRunner(), port)
    assert view is not None and [r["nodes"] for r in view["replicas"]] == [["a-node0"], ["a-r1-node0"]]
    text = "\n".join(format_replicas(view))
    assert "replica 0: a-node0  VM ACTIVE  engine running" in text and "7 requests" in text
    assert "replica 1: a-r1-node0  VM gone (404)" in text
    assert replicas_view(StackState(stack="s", outputs={}, nodes=[]), [], LocalRunner(), port) is None
