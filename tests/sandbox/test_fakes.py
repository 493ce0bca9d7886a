"""The sandbox's pieces on their own, in seconds: the docker run hook, the fake node's per-node knobs, the emulator's
test-only controls, the process bookkeeping and the output formatting.
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from kimi_cluster.blueprint.inputs import endpoint_inputs, engine_inputs
from kimi_cluster.cli.emulator import parse_fault
from kimi_cluster.fakes import sandbox_services as services
from kimi_cluster.fakes.hyperstack_emulator.emulator import Emulator
from kimi_cluster.fakes.hyperstack_emulator.faults import StuckInBuild, VmError
from kimi_cluster.fakes.node import BIN, make_fake_node
from kimi_cluster.plan import launch
from kimi_cluster.sandbox.nodes import ENGINE_HOOK, node_env, stack_settings
from kimi_cluster.sandbox.printing import format_outputs, format_report
from kimi_cluster.settings.loader import load_settings

from .conftest import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

# The hook is a standalone executable (the docker stub runs it by path), not a package module.
_spec = importlib.util.spec_from_file_location("engine_hook", ENGINE_HOOK)
engine_hook = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(engine_hook)

KEY = "sandbox-api-key-canary-3f9c"


def _settings(topology: str, port: int = 18000):
    return load_settings({"operatorCidr": "127.0.0.1/32", "allowPrivateOperatorCidr": True,
                          "topology": topology, "enginePort": str(port),
                          "apiPort": "8443",
                          "sshPublicKey": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIexample test"}, "sandbox")


def _docker_argv(topology: str, rank: int, port: int = 18000) -> list[str]:
    items = launch.docker_run_argv(engine_inputs(_settings(topology, port)), rank, private_ip="127.0.0.3",
                                   head_private_ip="127.0.0.2", hf_dir="/hf", cache_dir="/cache", nic="ens6",
                                   threads="1", fingerprint="fp")
    return [str(word) for word in launch.flatten(items)]


def _status(url: str, key: str | None = None, ca: str | None = None, data: bytes | None = None) -> int:
    import ssl

    request = urllib.request.Request(url, data=data, headers={"Authorization": f"Bearer {key}"} if key else {})
    handlers: list[urllib.request.BaseHandler] = [urllib.request.ProxyHandler({})]
    if ca:
        handlers.append(urllib.request.HTTPSHandler(context=ssl.create_default_context(cafile=ca)))
    try:
        with urllib.request.build_opener(*handlers).open(request, timeout=5) as answer:
            return answer.status
    except urllib.error.HTTPError as err:
        return err.code


@pytest.mark.parametrize("topology, engine", [("h100x4-sglang", "sglang"), ("b300x1-vllm", "vllm")])
def test_hook_serves_what_the_launch_asks_on_loopback_only_and_without_a_key(monkeypatch, topology, engine) -> None:
    monkeypatch.setenv("FAKE_IP_ADDRS", "lo=127.0.0.1/8,ens6=${SANDBOX_NODE_HOST}/8,docker0=172.17.0.1/16")
    monkeypatch.setenv("SANDBOX_NODE_HOST", "127.0.0.3")
    argv = _docker_argv(topology, 0)
    assert argv[:2] == ["docker", "run"]
    server_argv, env, name = engine_hook.plan(argv[2:])
    assert name == "kimi-engine"
    assert server_argv[1:3] == ["-m", "kimi_cluster.fakes.inference_server"]
    assert server_argv[server_argv.index("--engine") + 1] == engine
    listen = [server_argv[i + 1] for i, w in enumerate(server_argv) if w == "--listen"]
    # The engine binds the head's loopback only: not the node's private or public address.
    assert listen == ["127.0.0.1:18000"]
    assert server_argv[server_argv.index("--served-model-name") + 1] == "moonshotai/Kimi-K3.1-Pro"
    assert "--api-key" not in server_argv and "KIMI_API_KEY" not in env and "VLLM_API_KEY" not in env


def test_hook_passes_the_rank_and_refuses_an_unknown_engine() -> None:
    argv = _docker_argv("h100x4-sglang", 2)
    server_argv, _, _ = engine_hook.plan(argv[2:])
    assert server_argv[server_argv.index("--node-rank") + 1] == "2"
    with pytest.raises(engine_hook.HookError, match="cannot tell the engine"):
        engine_hook.plan(["--name", "x", "busybox:latest", "sleep", "1"])


def test_docker_stub_runs_the_keyless_engine_and_the_real_proxy_in_front_of_it(tmp_path) -> None:
    from kimi_cluster.deploy import tls
    from kimi_cluster.plan import proxy

    port = services.free_port()
    api_port = services.free_port(avoid={port})  # two draws could meet
    node = make_fake_node(tmp_path, run_hook=str(ENGINE_HOOK),
                          extra_env={"PATH": f"{BIN}:{Path(sys.executable).parent}:/usr/bin:/bin"})
    settings = load_settings({"operatorCidr": "127.0.0.1/32", "allowPrivateOperatorCidr": True,
                              "topology": "b300x1-vllm", "enginePort": str(port), "apiPort": str(api_port),
                              "sshPublicKey": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIexample test"}, "sandbox")
    argv = [str(w) for w in launch.flatten(launch.docker_run_argv(
        engine_inputs(settings), 0, private_ip="127.0.0.3", head_private_ip="127.0.0.3", hf_dir="/hf",
        cache_dir="/cache", nic="ens6", threads="1", fingerprint="fp"))]
    # The proxy's directory as the proxy step writes it.
    proxy_dir = node.root / "etc/kimi-cluster/proxy"
    proxy_dir.mkdir(parents=True)
    ca, ca_key = tls.make_ca("stub test CA")
    cert, cert_key = tls.make_server_certificate(ca, ca_key, ["127.0.0.1"])
    for name, text in ((proxy.CONFIG_FILE, proxy.render_config(endpoint_inputs(settings))), (proxy.CERT_FILE, cert),
                       (proxy.CA_FILE, ca), (proxy.TLS_KEY_FILE, cert_key), (proxy.KEY_FILE, KEY)):
        (proxy_dir / name).write_text(text)
    proxy_argv = [str(w) for w in launch.flatten(proxy.docker_run_argv(endpoint_inputs(settings), str(proxy_dir),
                                                                        "fp"))]
    try:
        run = subprocess.run(argv, env=node.env, cwd=node.root, capture_output=True, text=True, timeout=30)
        assert run.returncode == 0, run.stderr
        pid = int(wait_for("the engine's pid file", lambda: (node.state / "engines/kimi-engine.pid").exists()
                           and (node.state / "engines/kimi-engine.pid").read_text().strip(), 10))
        assert node.container("kimi-engine")["hook_pid"] == pid
        wait_for("the fake engine to listen", lambda: services.port_open("127.0.0.1", port), 20)
        # vLLM without a key, as it runs behind the proxy: open on loopback, /invocations included.
        assert _status(f"http://127.0.0.1:{port}/v1/models") == 200
        assert not services.port_open("127.0.0.3", port)

        run = subprocess.run(proxy_argv, env=node.env, cwd=node.root, capture_output=True, text=True, timeout=30)
        assert run.returncode == 0, run.stderr
        caddy = int(wait_for("the proxy's pid file", lambda: (node.state / "engines/kimi-proxy.pid").exists()
                             and (node.state / "engines/kimi-proxy.pid").read_text().strip(), 10))
        # The real binary, not a stand-in. The hook writes its pid, then execs caddy: until the exec is done the
        # pid's command line is the hook's (or, mid-exec, empty), so look until it is caddy's.
        wait_for("the proxy's process to be caddy",
                 lambda: Path((services._cmdline(caddy) or [""])[0]).name == "caddy", 10)
        wait_for("the proxy to listen", lambda: services.port_open("127.0.0.1", api_port), 20)
        base = f"https://127.0.0.1:{api_port}"
        assert _status(base + "/health", ca=str(proxy_dir / proxy.CA_FILE)) == 200
        assert _status(base + "/v1/models", ca=str(proxy_dir / proxy.CA_FILE)) == 401
        assert _status(base + "/invocations", "wrong", str(proxy_dir / proxy.CA_FILE), b"{}") == 401
        assert _status(base + "/v1/models", KEY, str(proxy_dir / proxy.CA_FILE)) == 200
        for name in ("kimi-proxy", "kimi-engine"):
            subprocess.run(["docker", "rm", "-f", name], env=node.env, check=True, timeout=10)
        wait_for("docker rm -f to stop both", lambda: not services._alive(pid) and not services._alive(caddy), 10)
    finally:
        node.cleanup()


def test_fake_node_takes_its_root_disks_and_address_from_the_sandbox(tmp_path) -> None:
    node_dir = tmp_path / "nodes" / "127.0.0.4"
    node_dir.mkdir(parents=True)
    env = {"PATH": f"{BIN}:{Path(sys.executable).parent}:/usr/bin:/bin", "SANDBOX_NODE_DIR": str(node_dir),
           "SANDBOX_NODE_HOST": "127.0.0.4", **node_env(stack_settings("b300x1-vllm"), "10.213.9.1")}
    out = subprocess.run(["ip", "-o", "-4", "addr", "show"], env=env, cwd=node_dir, capture_output=True, text=True,
                         timeout=10, check=True).stdout
    assert "ens6    inet 127.0.0.4/24" in out
    assert (node_dir / "ephemeral").is_dir()  # the stub "booted" the node: its disk exists
    assert (node_dir / "var/lib/fake-node/calls.jsonl").exists()
    gpus = subprocess.run(["nvidia-smi"], env=env, capture_output=True, text=True, timeout=10, check=True).stdout
    assert len(gpus.splitlines()) == 8


def test_emulator_faults_and_admin_paths_are_opt_in() -> None:
    assert parse_fault("vm-error:kimi-sandbox-node0") == VmError(name="kimi-sandbox-node0")
    assert parse_fault("stuck-in-build") == StuckInBuild(name=None)
    with pytest.raises(Exception, match="unknown fault"):
        parse_fault("meteor")
    with Emulator() as plain:
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"http://127.0.0.1:{plain.port}/_emulator/inventory", timeout=5)
        assert refused.value.code == 404
    with Emulator(admin=True) as admin:
        with urllib.request.urlopen(f"http://127.0.0.1:{admin.port}/_emulator/inventory", timeout=5) as answer:
            assert json.loads(answer.read())["virtual_machines"] == []
        with urllib.request.urlopen(f"http://127.0.0.1:{admin.port}/_emulator/requests", timeout=5) as answer:
            assert json.loads(answer.read()) == []  # admin reads are not API requests


def test_node_processes_are_found_by_their_node_not_by_where_they_stand(tmp_path) -> None:
    nodes = tmp_path / "nodes"
    (nodes / "127.0.0.2").mkdir(parents=True)
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    node_proc = subprocess.Popen(sleeper, env={**os.environ, "SANDBOX_NODE_DIR": str(nodes / "127.0.0.2")})
    # A shell someone opened in a node's directory is not the node's.
    visitor = subprocess.Popen(sleeper, cwd=nodes / "127.0.0.2")
    try:
        wait_for("the node's process to show", lambda: node_proc.pid in services.processes_under(nodes), 5)
        assert visitor.pid not in services.processes_under(nodes)
        assert services.terminate([node_proc.pid], timeout=5) == []
    finally:
        for proc in (node_proc, visitor):
            proc.kill()
            proc.wait(timeout=5)


def test_outputs_show_secrets_masked_and_big_values_summarised() -> None:
    text = format_outputs({"api_key": "k-123456", "endpoint_url": "http://127.0.0.2:8000",
                           "client_configs": {"openai": {"x": "y" * 200}, "claude_code": {}}}, {"api_key"})
    assert "k-123456" not in text and "[secret]" in text
    assert "{openai, claude_code}" in text
    table = format_report([{"name": "auth", "passed": False, "latency_s": 0.5, "detail": "open endpoint",
                            "required": True}])
    assert "auth" in table and "FAIL" in table and "open endpoint" in table


def test_services_start_and_stop_by_pid(tmp_path) -> None:
    port = services.free_port()
    started = time.monotonic()
    service = services.start("hub", services.python_module("kimi_cluster.fakes.hub", "--port", str(port)),
                             host="127.0.0.1",
                             port=port, marker="kimi_cluster.fakes.hub", log_dir=tmp_path)
    try:
        assert service.running()
        assert time.monotonic() - started < 30
    finally:
        assert services.stop(service)
    assert not service.running()
    # A pid that is no longer the service (or never was) is left alone.
    assert services.stop(services.Service("hub", os.getpid(), "127.0.0.1", port, "no-such-marker", "")) is True


def test_a_chosen_port_is_free_on_every_host_and_outside_the_ephemeral_range(monkeypatch) -> None:
    low, _ = services.ephemeral_range()
    hosts = ("127.0.0.1", "127.0.0.2")
    # Two ports of the pool, free now; then a listener on the first, which the draws offer first.
    taken = services.free_port(*hosts)
    other = services.free_port(*hosts, avoid={taken})
    with socket.socket() as busy:
        busy.bind(("127.0.0.2", taken))
        busy.listen()
        draws = iter([taken, other])
        monkeypatch.setattr(services.random, "choice", lambda pool: next(draws))
        assert services.free_port(*hosts) == other
        # Held on 127.0.0.2 alone, it is still passed over for 127.0.0.1: a wildcard bind (`:PORT`) would fail.
        draws = iter([taken, other])
        assert services.free_port() == other
    monkeypatch.undo()
    for _ in range(20):
        port = services.free_port(*hosts)
        assert services.PORT_FLOOR <= port < low
        for host in hosts:
            assert services.port_free(host, port)


def test_a_chosen_port_with_a_span_keeps_its_neighbours_free_and_out_of_avoid(monkeypatch) -> None:
    base = services.PORT_FLOOR + 300
    with socket.socket() as busy:  # a listener on the port above the second draw: that draw must be passed over
        busy.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            busy.bind(("127.0.0.1", base + 11))
        except OSError:
            pytest.skip(f"port {base + 11} is taken on this machine")
        busy.listen()
        # Then candidates 10 apart: the suite's other fakes draw from the same pool, so base + 20 may be taken by the
        # time it is checked; the draw after it then serves.
        draws = iter([base, base + 10, *range(base + 20, base + 200, 10)])
        monkeypatch.setattr(services.random, "choice", lambda pool: next(draws))
        # base + 1 is in avoid, base + 11 has a listener: both first draws are passed over.
        chosen = services.free_port(span=3, avoid={base + 1})
        assert chosen in range(base + 20, base + 200, 10)


def test_the_sandbox_draws_ports_the_settings_accept_even_when_the_draws_clash(monkeypatch) -> None:
    from kimi_cluster.sandbox.services import _choose_ports
    from kimi_cluster.settings.cross_rules import tokenspeed_problem

    engine = services.PORT_FLOOR + 500
    # The draws the CI run met (apiPort on enginePort + 2), then apiPort's own port again for peerPort.
    draws = iter([engine, engine + 2, engine + 40, engine + 40, engine + 1, engine + 60])
    monkeypatch.setattr(services.random, "choice", lambda pool: next(draws))
    monkeypatch.setattr(services, "port_free", lambda host, port, time_wait_is_free=True: True)
    record: dict = {}
    _choose_ports(record)
    assert record == {"engine_port": engine, "api_port": engine + 40, "peer_port": engine + 60}
    assert tokenspeed_problem("tokenspeed", 1, "img", engine, engine + 40, engine + 60) is None
    settings = stack_settings("b300x1-tokenspeed", {"image": "lightseekorg/tokenspeed:0.1.1",
                                                    "apiPort": str(engine + 40), "enginePort": str(engine),
                                                    "peerPort": str(engine + 60)})
    assert (settings.api_port, settings.engine_port, settings.peer_port) == (engine + 40, engine, engine + 60)
    # A record that holds some ports keeps them, and the one drawn now clears them all.
    draws = iter([engine + 40, engine + 59, engine + 61])
    kept = {"api_port": engine + 40, "peer_port": engine + 60}
    _choose_ports(kept)
    assert kept == {"api_port": engine + 40, "peer_port": engine + 60, "engine_port": engine + 61}


def test_the_sandbox_stack_never_points_at_the_real_api_or_hub() -> None:
    from kimi_cluster.sandbox.kimi import REPO_ROOT
    from kimi_cluster.settings.loader import read_stack_file

    ours, others = read_stack_file(str(REPO_ROOT / "Pulumi.sandbox.yaml"))
    assert others["hyperstack:apiUrl"].startswith("http://127.0.0.1:")
    assert ours["hfEndpoint"].startswith("http://127.0.0.1:")
    assert stack_settings("h100x4-sglang").operator_cidr == "127.0.0.1/32"


def _render_container_argv(topology: str, tmp_path: Path) -> list[str]:
    """The front's `docker run` of its render container (kimi_cluster/plan/resume.py) for a 2-replica `topology`,
    as the resume step's shell expands its words; the container's environment file holds HF_TOKEN=hf_secret."""
    from kimi_cluster.blueprint.inputs import resume_inputs
    from kimi_cluster.plan import resume
    from kimi_cluster.plan.jinja import shell_words
    from tests.node.conftest import make_settings

    layer = resume_inputs(make_settings(topology, replicas="2"))
    env_file = tmp_path / "render.env"
    env_file.write_text("HF_TOKEN=hf_secret\n")
    words = shell_words(resume.render_docker_argv(layer, str(env_file), str(tmp_path / "hf")))
    shell_env = {"PATH": os.environ["PATH"], "STATE": str(tmp_path / "state"), "RENDER_NAME": "kimi-render",
                 "RENDER_PORT": "20081", "FINGERPRINT": "f" * 16}
    expanded = subprocess.run(["bash", "-c", f"printf '%s\\0' {words}"], env=shell_env, capture_output=True,
                              text=True, check=True).stdout
    argv = expanded.split("\0")[:-1]
    assert argv[:3] == ["docker", "run", "-d"]
    return argv


def _stand_in(tmp_path: Path, name: str) -> Path:
    """An executable that does nothing, for the hook's named program."""
    program = tmp_path / name
    program.write_text("#!/bin/sh\n")
    program.chmod(0o755)
    return program


def test_hook_runs_sglangs_chat_layer_from_the_mounted_program_with_the_named_python(monkeypatch, tmp_path) -> None:
    """The front's `docker run` of SGLang's chat layer (kimi_cluster/plan/resume.py), as the resume step words it:
    the image's python3 becomes FAKE_SGLANG_PYTHON, the program and the hub cache the mounts' host folders."""
    argv = _render_container_argv("h100x4-sglang", tmp_path)
    monkeypatch.setenv("FAKE_NODE_ROOT", str(tmp_path))
    monkeypatch.delenv("FAKE_SGLANG_PYTHON", raising=False)
    with pytest.raises(engine_hook.HookError, match="FAKE_SGLANG_PYTHON"):
        engine_hook.render_plan(engine_hook.parse_run(argv[2:]))
    python = _stand_in(tmp_path, "python3")
    monkeypatch.setenv("FAKE_SGLANG_PYTHON", str(python))
    planned = engine_hook.render_plan(engine_hook.parse_run(argv[2:]))
    assert planned is not None
    server_argv, env, name = planned
    assert name == "kimi-render" and server_argv[:3] == [str(python), "-m", "kimi_cluster.node.sglang_chat"]
    assert server_argv[server_argv.index("--port") + 1] == "20081"
    assert env["PYTHONPATH"] == str(tmp_path / "state/sglang-chat-program")
    assert env["HF_HOME"] == str(tmp_path / "hf") and env["HF_TOKEN"] == "hf_secret"
    # The engine is not a render container: its plan is the fake server.
    assert engine_hook.render_plan(engine_hook.parse_run(_docker_argv("h100x4-sglang", 0)[2:])) is None


def test_hook_runs_vllms_render_server_with_the_named_vllm(monkeypatch, tmp_path) -> None:
    """The front's `docker run` of vLLM's render server, as the resume step words it: the image's `vllm` becomes
    FAKE_VLLM, the hub cache the mount's host folder, and the container's own environment comes along."""
    argv = _render_container_argv("b300x1-vllm", tmp_path)
    monkeypatch.setenv("FAKE_NODE_ROOT", str(tmp_path))
    monkeypatch.delenv("FAKE_VLLM", raising=False)
    with pytest.raises(engine_hook.HookError, match="vLLM's render server needs a real vLLM: set FAKE_VLLM"):
        engine_hook.render_plan(engine_hook.parse_run(argv[2:]))
    vllm = _stand_in(tmp_path, "vllm")
    monkeypatch.setenv("FAKE_VLLM", str(vllm))
    planned = engine_hook.render_plan(engine_hook.parse_run(argv[2:]))
    assert planned is not None
    server_argv, env, name = planned
    assert name == "kimi-render" and server_argv[:3] == [str(vllm), "launch", "render"]
    assert server_argv[server_argv.index("--port") + 1] == "20081"
    assert env["HF_HOME"] == str(tmp_path / "hf") and env["HF_TOKEN"] == "hf_secret"
    assert env["VLLM_TARGET_DEVICE"] == "cpu"
    assert engine_hook.render_plan(engine_hook.parse_run(_docker_argv("b300x1-vllm", 0)[2:])) is None


def test_vllms_render_server_finds_the_shared_model_infos_where_vllm_looks(monkeypatch, tmp_path) -> None:
    """The render server's model-info folder (VLLM_CACHE_ROOT/modelinfos, vLLM's rule: its variable, else
    $XDG_CACHE_HOME/vllm, else ~/.cache/vllm) is the one FAKE_VLLM_MODEL_INFOS names; a node's own folder is kept,
    and without the knob, or for SGLang's chat layer, nothing is linked."""
    shared = tmp_path / "host-cache/vllm/modelinfos"
    render = ["/venv/bin/vllm", "launch", "render", "org/model"]
    monkeypatch.setenv(engine_hook.MODEL_INFOS_KNOB, str(shared))
    cases = [({"HOME": str(tmp_path / "a")}, tmp_path / "a/.cache/vllm/modelinfos"),
             ({"HOME": str(tmp_path / "b"), "XDG_CACHE_HOME": str(tmp_path / "b/xdg")},
              tmp_path / "b/xdg/vllm/modelinfos"),
             ({"HOME": str(tmp_path / "c"), "VLLM_CACHE_ROOT": str(tmp_path / "c/root")},
              tmp_path / "c/root/modelinfos")]
    for env, where in cases:
        engine_hook.share_model_infos(render, env)
        assert where.is_symlink() and where.resolve() == shared.resolve() and shared.is_dir()
        engine_hook.share_model_infos(render, env)  # the node's next render server: the same link
        assert where.resolve() == shared.resolve()
    own = tmp_path / "d/.cache/vllm/modelinfos"
    own.mkdir(parents=True)
    engine_hook.share_model_infos(render, {"HOME": str(tmp_path / "d")})
    assert own.is_dir() and not own.is_symlink()
    sglang_chat = ["/venv/bin/python", "-m", "kimi_cluster.node.sglang_chat"]
    engine_hook.share_model_infos(sglang_chat, {"HOME": str(tmp_path / "e")})
    monkeypatch.delenv(engine_hook.MODEL_INFOS_KNOB)
    engine_hook.share_model_infos(render, {"HOME": str(tmp_path / "f")})
    assert not (tmp_path / "e").exists() and not (tmp_path / "f").exists()
    # The sandbox passes the host's own vLLM cache to its nodes.
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "host-root"))
    assert node_env(stack_settings("b300x1-vllm"), "10.213.9.1")[engine_hook.MODEL_INFOS_KNOB] == str(
        tmp_path / "host-root/modelinfos")
