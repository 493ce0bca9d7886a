"""The pieces of `status`: reading a Pulumi export, SSH with the pinned host key only, rates and ETAs, the metrics
an engine exposes, the advice line, and the node probe against a fake node directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from kimi_cluster.operator import status_gather
from kimi_cluster.operator.node_exec import SshRunner, probe_command
from kimi_cluster.operator.stack_state import SECRET_SIG, SIG_KEY, Connection, parse_state

ROOT = Path(__file__).resolve().parents[2]
HOST_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHostKeyPinnedByTheStack0000000000000000"
PRIVATE = "-----BEGIN OPENSSH PRIVATE KEY-----\ncanary-private-key-3f1\n-----END OPENSSH PRIVATE KEY-----"


def _secret(value):
    """A secret as `pulumi stack export --show-secrets` writes it (v3.259.0): its value as JSON text, in which a
    secret of its own (a connection's privateKey) is written the same way."""
    return {SIG_KEY: SECRET_SIG, "plaintext": json.dumps(value)}


def _export() -> dict:
    conn = {"host": "198.51.100.10", "user": "ubuntu", "privateKey": _secret(PRIVATE), "hostKey": HOST_KEY}
    return {"version": 3, "deployment": {"resources": [
        {"urn": "urn:pulumi:dev::kimi-cluster::pulumi:pulumi:Stack::kimi-cluster-dev", "type": "pulumi:pulumi:Stack",
         "outputs": {"api_key": _secret("endpoint-key"), "hourly_cost_usd": 83.2, "region": "NORWAY-1"}},
        {"urn": "urn:...::pulumi-python:dynamic/hyperstack:VirtualMachine::kimi-node1", "id": "1002",
         "type": "pulumi-python:dynamic/hyperstack:VirtualMachine",
         "outputs": {"name": "kimi-dev-node1", "public_ip": "198.51.100.11", "labels": ["rank-1"]}},
        {"urn": "urn:...::pulumi-python:dynamic/hyperstack:VirtualMachine::kimi-node0", "id": "1001",
         "type": "pulumi-python:dynamic/hyperstack:VirtualMachine",
         "outputs": {"name": "kimi-dev-node0", "public_ip": "198.51.100.10", "labels": ["kimi-cluster", "rank-0"]}},
        {"urn": "urn:...::command:remote:Command::kimi-node0-ready", "type": "command:remote:Command",
         "inputs": {"connection": _secret(conn)}},
    ]}}


def test_a_pulumi_export_gives_the_nodes_in_rank_order_with_their_pinned_connection():
    state = parse_state(_export(), "dev")
    assert [(n.rank, n.name, n.vm_id) for n in state.nodes] == [(0, "kimi-dev-node0", "1001"),
                                                                (1, "kimi-dev-node1", "1002")]
    conn = state.nodes[0].connection
    assert conn is not None and conn.host_key == HOST_KEY and conn.private_key == PRIVATE
    assert state.nodes[1].connection is None  # no node command reaches it yet
    assert state.outputs["api_key"] == "endpoint-key" and state.outputs["region"] == "NORWAY-1"
    assert PRIVATE not in repr(conn)


def test_the_sdks_wire_form_of_a_secret_and_an_unreadable_plaintext_are_read_too():
    doc = _export()
    ready = doc["deployment"]["resources"][-1]
    conn = json.loads(ready["inputs"]["connection"]["plaintext"])
    ready["inputs"]["connection"] = {SIG_KEY: SECRET_SIG, "value": {**conn, "privateKey": PRIVATE}}
    doc["deployment"]["resources"][0]["outputs"]["api_key"] = {SIG_KEY: SECRET_SIG, "plaintext": "{not json"}
    state = parse_state(doc, "dev")
    assert state.nodes[0].connection is not None and state.nodes[0].connection.private_key == PRIVATE
    assert state.outputs["api_key"] is None


def _fake_ssh(tmp_path: Path) -> str:
    """An `ssh` that records its argv and the known_hosts file it was given, then runs nothing."""
    path = tmp_path / "ssh"
    path.write_text("#!/usr/bin/env python3\nimport json, os, sys\nargv = sys.argv[1:]\n"
                    "known = next(a.split('=', 1)[1] for a in argv if a.startswith('UserKnownHostsFile='))\n"
                    "key = argv[argv.index('-i') + 1]\n"
                    "print(json.dumps({'argv': argv, 'known_hosts': open(known).read(),\n"
                    "    'key_mode': oct(os.stat(key).st_mode & 0o777), 'stdin': sys.stdin.read()}))\n")
    path.chmod(0o755)
    return str(path)


def test_ssh_accepts_only_the_pinned_host_key_and_keeps_the_private_key_off_the_command_line(tmp_path):
    runner = SshRunner(ssh=_fake_ssh(tmp_path))
    conn = Connection(host="198.51.100.10", user="ubuntu", private_key=PRIVATE, host_key=HOST_KEY)
    code, out, _ = runner.run(conn, "echo hi", "probe text", 10)
    seen = json.loads(out)
    assert code == 0 and seen["known_hosts"] == f"198.51.100.10 {HOST_KEY}\n"
    assert "StrictHostKeyChecking=yes" in seen["argv"] and "GlobalKnownHostsFile=/dev/null" in seen["argv"]
    assert seen["argv"][-2:] == ["ubuntu@198.51.100.10", "echo hi"] and seen["stdin"] == "probe text"
    assert seen["key_mode"] == "0o600" and not any(PRIVATE in a for a in seen["argv"])
    assert not list(tmp_path.glob("kimi-status-*"))
    code, _, err = runner.run(Connection(host="198.51.100.10", user="ubuntu", private_key=PRIVATE), "x", "", 10)
    assert code == 255 and "no pinned host key" in err


def test_rate_eta_and_percent_from_the_progress_file_and_from_two_samples():
    now = time.time()
    probe = {"steps": [{"step": "weights", "started_at": now - 100, "running": True}],
             "weights": {"bytes_done": 500, "bytes_total": 1000, "updated_at": now, "source": "progress file"}}
    view = status_gather.weights_view(probe, None, now)
    assert view["percent"] == 50.0 and view["rate_bytes_s"] == 5.0 and view["eta_s"] == 100.0
    view = status_gather.weights_view(probe, status_gather.Sample(at=now - 10, bytes_done=300), now)
    assert view["rate_bytes_s"] == 20.0 and view["eta_s"] == 25.0


def test_requests_and_tokens_from_either_engines_metrics():
    sglang = "# HELP x\nsglang:num_requests_total{model=\"m\"} 12\nsglang:prompt_tokens_total{a=\"1\"} 3400.0\n" \
             "sglang:generation_tokens_total 900\n"
    assert status_gather.parse_metrics(sglang) == {"requests": 12, "prompt_tokens": 3400, "generation_tokens": 900}
    vllm = "vllm:request_success_total{finished_reason=\"stop\"} 4\nvllm:request_success_total{finished_reason=" \
           "\"length\"} 1\nvllm:generation_tokens_total 77\n"
    assert status_gather.parse_metrics(vllm) == {"requests": 5, "generation_tokens": 77}


def test_the_advice_names_the_node_and_what_to_do():
    looping = [{"name": "n0", "probe": {"engine": {"restart_count": 4}}, "weights": None, "vm": {}}]
    assert "n0: the engine is restarting in a loop (4 restarts)" in status_gather.advice(looping, {})
    stalled = [{"name": "n1", "probe": {}, "vm": {},
                "weights": {"bytes_done": 1, "bytes_total": 2, "seconds_since_progress": 660}}]
    assert "n1: no download progress for 11 min" in status_gather.advice(stalled, {})
    fresh = [{"name": "n1", "probe": {}, "vm": {},
              "weights": {"bytes_done": 1, "bytes_total": 2, "seconds_since_progress": 30}}]
    assert status_gather.advice(fresh, {}) is None


def test_the_probe_reads_a_node_before_any_progress_file_exists(tmp_path):
    home = tmp_path / "node"
    (home / ".kimi-cluster").mkdir(parents=True)
    (home / ".kimi-cluster" / "weights.sh").write_text("# step\n")
    blobs = home / "ephemeral/hf/hub/models--org--m/blobs"
    blobs.mkdir(parents=True)
    (blobs / "a").write_bytes(b"x" * 250)
    bin_dir = tmp_path / "bin"  # no docker, no systemctl: the probe still answers
    bin_dir.mkdir()
    env = {"HOME": str(home), "PATH": f"{bin_dir}:{ROOT / 'kimi_cluster/fakes/node/bin'}:{os.environ['PATH']}",
           "FAKE_NODE_ROOT": str(home)}
    argv = ["bash", "-c", probe_command(".", "/ephemeral", "models--org--m", 1000).replace("python3", sys.executable)]
    done = subprocess.run(argv, cwd=home, env=env, input=(ROOT / "kimi_cluster/node/node_status.py").read_text(),
                          capture_output=True, text=True, timeout=60)
    report = json.loads(done.stdout)
    assert report["weights"]["bytes_done"] == 250 and report["weights"]["source"] == "size of the hub cache"
    assert [s["step"] for s in report["steps"]] == ["weights"] and report["engine"]["state"] in ("absent", "unknown")


def test_an_https_endpoint_is_trusted_through_the_stacks_ca_only(tmp_path):
    import http.server
    import shutil
    import ssl
    import threading

    import pytest

    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is needed to make the test's CA and server certificate")

    def sh(*argv: str) -> None:
        subprocess.run(argv, cwd=tmp_path, check=True, capture_output=True)

    sh("openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout",
       "ca.key", "-out", "ca.pem", "-days", "1", "-subj", "/CN=kimi test CA")
    sh("openssl", "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", "srv.key",
       "-out", "srv.csr", "-subj", "/CN=127.0.0.1")
    (tmp_path / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    sh("openssl", "x509", "-req", "-in", "srv.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
       "-out", "srv.pem", "-days", "1", "-extfile", "san.ext")

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = json.dumps({"data": [{"id": "m"}]}).encode() if self.path == "/v1/models" else b"{}"
            self.send_response(200 if self.path != "/metrics" else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_a):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tmp_path / "srv.pem", tmp_path / "srv.key")
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"https://127.0.0.1:{server.server_address[1]}"
        trusted = status_gather.endpoint_view(url, "k", "m", (tmp_path / "ca.pem").read_text())
        assert trusted["health"] == "ok" and trusted["serves_model"] is True
        assert status_gather.endpoint_view(url, "k", "m")["health"].startswith("unreachable")
    finally:
        server.shutdown()


def test_the_fake_engine_counts_what_it_served_and_status_reads_it():
    import requests

    from kimi_cluster.fakes.inference.server import FakeInferenceServer
    from kimi_cluster.fakes.inference.settings import FakeSettings

    settings = FakeSettings(engine="vllm", api_key="k", served_model_names=("m",))
    with FakeInferenceServer(settings) as fake:
        for _ in range(2):
            answer = requests.post(f"{fake.url}/v1/chat/completions", headers={"Authorization": "Bearer k"},
                                   json={"model": "m", "messages": [{"role": "user", "content": "hi"}]}, timeout=10)
            assert answer.ok
        usage = answer.json()["usage"]
        view = status_gather.endpoint_view(fake.url, "k", "m")
    assert view["health"] == "ok" and view["serves_model"] is True and view["requests"] == 2
    assert view["generation_tokens"] == 2 * usage["completion_tokens"] and view["prompt_tokens"] > 0


def test_the_probe_knows_every_step_the_nodes_run():
    from kimi_cluster.node import node_status
    from kimi_cluster.node.weights import PROGRESS_FILE
    from kimi_cluster.operator.node_exec import probe_command
    from kimi_cluster.plan.steps.table import NAMES

    # The operator tells the probe the table's steps: a new step needs no edit on the node's side.
    assert probe_command("/", "/ephemeral", "models--org--m", 1).endswith(" --steps " + ",".join(NAMES))
    assert node_status.PROGRESS_FILE == PROGRESS_FILE  # the weights step's contract, read without the package


def test_without_an_api_key_the_screen_says_what_it_cannot_know():
    from kimi_cluster.operator.status_report import format_report

    report = {"stack": "dev", "topology": "h100x4-sglang", "region": "CANADA-1", "uptime_s": None,
              "hourly_cost_usd": 83.2, "cost_so_far_usd": None, "hourly_cost_source": None, "advice": None,
              "nodes": [{"name": "kimi-dev-node0", "vm": {"status": "unknown (no API key)"}, "uptime_s": None,
                         "step": "weights", "weights": None, "engine": {"state": "absent"}}],
              "endpoint": {"url": None, "health": "no address yet", "ready_output": False}}
    text = format_report(report)
    assert "$83.20/h (cost so far needs the VMs' creation times: set HYPERSTACK_API_KEY)" in text
    assert "unknown (no API key)" in text and "$0.00" not in text


class _Api:
    """The one call status makes of the Hyperstack API: each VM's creation time (here, an hour ago). Passed where a
    HyperstackClient goes (cast: gather calls get_vm only)."""

    def __init__(self, created_at: float) -> None:
        self.created_at = created_at

    def get_vm(self, vm_id: int) -> dict:
        return {"status": "ACTIVE", "created_at": self.created_at}


def _api() -> Any:
    return _Api(time.time() - 3600)


def _one_node_state(url: str):
    from kimi_cluster.operator.stack_state import NodeRecord, StackState

    node = NodeRecord(rank=0, name="kimi-dev-node0", vm_id="1001", public_ip="127.0.0.1", private_ip=None,
                      connection=None)
    return StackState(stack="dev", outputs={"api_key": "k", "hourly_cost_usd": 83.2, "endpoint_url": url},
                      nodes=[node])


def _settings():
    from kimi_cluster.settings.loader import load_settings

    return load_settings({"operatorCidr": "203.0.113.7/32", "sshPublicKey": "ssh-ed25519 AAAAC3Nza test",
                          "servedModelName": "m"}, "dev")


def test_status_prices_the_tokens_served_against_the_api_and_a_fresh_cluster_shows_no_cost_per_token_yet():
    import requests

    from kimi_cluster.fakes.inference.server import FakeInferenceServer
    from kimi_cluster.fakes.inference.settings import FakeSettings
    from kimi_cluster.operator.status_report import format_report

    with FakeInferenceServer(FakeSettings(engine="vllm", api_key="k", served_model_names=("m",))) as fake:
        fresh = status_gather.gather(_one_node_state(fake.url), _settings(), None, _api())
        assert fresh["token_cost"]["output_tokens"] == 0 and fresh["token_cost"]["usd_per_m_output"] is None
        assert "no output token yet" in format_report(fresh)
        answer = requests.post(f"{fake.url}/v1/chat/completions", headers={"Authorization": "Bearer k"},
                               json={"model": "m", "messages": [{"role": "user", "content": "hi"}]}, timeout=10)
        usage = answer.json()["usage"]
        report = status_gather.gather(_one_node_state(fake.url), _settings(), None, _api())
    tc = report["token_cost"]
    assert (tc["input_tokens"], tc["output_tokens"]) == (usage["prompt_tokens"], usage["completion_tokens"])
    spent = report["cost_so_far_usd"]
    assert 83.0 < spent < 83.5  # one hour of $83.20/h
    assert tc["usd_per_m_output"] == pytest.approx(spent / usage["completion_tokens"] * 1e6, rel=1e-4)
    api = (usage["prompt_tokens"] * 2.0 + usage["completion_tokens"] * 10.0) / 1e6
    assert tc["api_usd_same_tokens"] == pytest.approx(api, abs=1e-4)
    text = format_report(report)
    assert "per 1M output tokens so far" in text and "the API would have charged" in text
    assert json.loads(json.dumps(report))["token_cost"]["api"]["as_of"] == "2026-11-10"  # the --json form
