"""Each step's script under real bash against a fake node: re-runs end in the same state, faults fail with a reason."""

from __future__ import annotations

import http.server
import json
import os
import shutil
import stat
import threading
import time
from dataclasses import replace

import pytest

from kimi_cluster.blueprint import blueprint, render_node_scripts, render_step
from kimi_cluster.blueprint.inputs import compile_steps
from kimi_cluster.deploy.remote_step import remote_command_text
from tests.node.conftest import FAST, REVISION, chmod_spy, make_settings

pytestmark = pytest.mark.integration  # starts fake nodes, servers or outside tools

API_KEY = "endpoint-canary-key-b61d"
QUICK_GIVE_UP = replace(FAST, cloud_init_timeout_s=1, gpu_timeout_s=1, readiness_timeout_s=1)


def scripts_for(node, topology="h100x4-sglang", rank=0, private_ip="10.0.0.5", head_ip="10.0.0.5", timing=FAST,
                **extra):
    settings = make_settings(topology, nodeRoot=str(node.root), **extra)
    return render_node_scripts(settings, rank, private_ip, head_ip, timing)


def ok(result):
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def failed(result, *reasons):
    assert result.returncode != 0, result.stdout
    for reason in reasons:
        assert reason in result.stdout + result.stderr, result.stdout + result.stderr
    return result.stdout + result.stderr


# ---- ready --------------------------------------------------------------------------------------------------------

def test_ready_waits_for_cloud_init_counts_gpus_and_finds_the_interface(node_factory):
    node = node_factory(cloud_init_running_polls=2, nic="enp7s0", private_ip="10.1.2.3")
    out = ok(node.run(scripts_for(node, private_ip="10.1.2.3")["ready"]))
    assert "cloud-init is still running" in out
    assert "private network: enp7s0 holds 10.1.2.3" in out
    assert ok(node.run(scripts_for(node, private_ip="10.1.2.3")["ready"]))  # a re-run is harmless


def test_ready_fails_on_the_wrong_gpu_count(node_factory):
    node = node_factory(gpus=4)
    failed(node.run(scripts_for(node)["ready"]), "should show 8 GPUs but nvidia-smi lists 4")


def test_ready_gives_up_on_a_missing_driver_and_says_what_it_waited_for(node_factory):
    node = node_factory(gpus=0)
    failed(node.run(scripts_for(node, timing=QUICK_GIVE_UP)["ready"]), "waiting for nvidia-smi to answer")


def test_ready_gives_up_on_cloud_init_with_a_deadline(node_factory):
    node = node_factory(cloud_init_running_polls=1000)
    failed(node.run(scripts_for(node, timing=QUICK_GIVE_UP)["ready"]), "gave up after 1 s waiting for cloud-init",
           "last status: running")


def test_ready_fails_when_no_interface_holds_the_private_address(node_factory):
    node = node_factory(private_ip="10.0.0.99")
    failed(node.run(scripts_for(node, private_ip="10.0.0.5")["ready"]),
           "no interface holds the private address 10.0.0.5", "ens6=10.0.0.99/24")


# ---- storage ------------------------------------------------------------------------------------------------------

def test_storage_moves_docker_once_and_a_rerun_changes_nothing(node):
    script = scripts_for(node)["storage"]
    first = ok(node.run(script))
    daemon = node.root / "etc/docker/daemon.json"
    config = json.loads(daemon.read_text())
    assert config["data-root"] == str(node.root / "ephemeral/docker")
    assert config["runtimes"]["nvidia"]["path"] == "nvidia-container-runtime"  # merged, not overwritten
    assert node.docker_state()["root"] == str(node.root / "ephemeral/docker")
    written = daemon.stat().st_mtime_ns

    second = ok(node.run(script))
    assert "already keeps its data on" in second and "moving" in first
    assert daemon.stat().st_mtime_ns == written
    prunes = [c for c in node.calls("docker") if c[:2] == ["system", "prune"]]
    stops = [c for c in node.calls("systemctl") if c[:1] == ["stop"]]
    assert len(prunes) == 1 and len(stops) == 1
    for d in ("ephemeral/hf/hub", "ephemeral/docker", "ephemeral/cache/sglang"):
        assert (node.root / d).is_dir()


def test_a_hung_step_is_stopped_on_the_node_at_its_own_deadline(node_factory):
    # pulumi-command would wait for a hung command forever; the node-side deadline ends it and says so.
    node = node_factory(hang="nvidia-smi")
    settings = make_settings(nodeRoot=str(node.root))
    deadline = 3  # the node side's own mechanism; stepDeadlineMinutes is a minute at least (issue 44)
    command = remote_command_text("ready", render_step(settings, "ready", 0, "10.0.0.5", "10.0.0.5", FAST),
                                  deadline_s=deadline)
    started = time.monotonic()
    done = node.shell(command, timeout=60)
    took = time.monotonic() - started
    assert done.returncode == 124, done.stdout + done.stderr
    assert "kimi-cluster step ready ran out of its 3 s deadline on the node and was stopped" in done.stderr
    assert "kimi-cluster:stepDeadlineMinutes" in done.stderr
    assert 3 <= took < 30
    # The hung stub went with it: timeout signals the step's whole process group.
    assert not [p for p in _processes_under(node.root) if "nvidia-smi" in p]


def test_a_step_that_fails_on_its_own_is_not_called_out_of_time(node_factory):
    node = node_factory(gpus=4)
    command = remote_command_text("ready", scripts_for(node)["ready"], deadline_s=60)
    done = node.shell(command)
    assert done.returncode == 1 and "ran out of" not in done.stderr
    assert "should show 8 GPUs but nvidia-smi lists 4" in done.stderr


def _processes_under(root) -> list[str]:
    """Command lines of live processes whose command line names a path under `root`."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = open(f"/proc/{entry}/cmdline", "rb").read().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if str(root) in cmdline:
                found.append(cmdline)
    return found


def test_storage_refuses_a_disk_too_small_for_checkpoint_and_margin(node_factory):
    node = node_factory(disk_avail_bytes=1_000 * 10**9)
    out = failed(node.run(scripts_for(node)["storage"]), "not enough space on", "short")
    assert "1,561.3 GB checkpoint + 100 GB margin" in out
    assert node.calls("systemctl") == []  # nothing moved on a disk that cannot hold the weights


def test_storage_counts_what_is_already_downloaded(node_factory):
    # 1,000 bytes short of the checkpoint: refused on an empty disk, accepted once 2 KB of it are already there.
    avail = 1_561_293_160_568 - 1_000
    empty = node_factory(disk_avail_bytes=avail)
    failed(empty.run(scripts_for(empty, diskMarginGb=0)["storage"]), "not enough space")
    resumed = node_factory(disk_avail_bytes=avail)
    blobs = resumed.root / "ephemeral/hf/hub/models--moonshotai--Kimi-K3.1-Pro/blobs"
    blobs.mkdir(parents=True)
    (blobs / "part-of-a-shard").write_bytes(b"x" * 2048)
    ok(resumed.run(scripts_for(resumed, diskMarginGb=0)["storage"]))


# ---- image --------------------------------------------------------------------------------------------------------

def test_image_pull_is_skipped_when_present(node):
    script = scripts_for(node, rank=1)["image"]
    ok(node.run(script))
    assert "already present" in ok(node.run(script))
    assert len(node.calls("docker")) and sum(1 for c in node.calls("docker") if c[0] == "pull") == 1


def test_the_head_pulls_the_engine_and_the_proxy_image(node):
    ok(node.run(scripts_for(node, rank=0)["image"]))
    pulled = [c[-1] for c in node.calls("docker") if c[0] == "pull"]
    assert pulled[0] == "lmsysorg/sglang:dev-kimi-k31-pro" and pulled[1].startswith("caddy:2.11.7-alpine@sha256:")


def test_image_pull_retries_a_flaky_registry(node_factory):
    node = node_factory(pull_fails=2)
    out = ok(node.run(scripts_for(node)["image"]))
    assert "attempt 3 of 3" in out and "TLS handshake timeout" in out


def test_image_pull_gives_up_with_the_registry_error(node_factory):
    node = node_factory(pull_fails=-1)
    failed(node.run(scripts_for(node)["image"]), "could not pull lmsysorg/sglang:dev-kimi-k31-pro after 3 attempts",
           "TLS handshake timeout")


# ---- launch -------------------------------------------------------------------------------------------------------

def _weights_on_disk(node):
    snap = node.root / f"ephemeral/hf/hub/models--moonshotai--Kimi-K3.1-Pro/snapshots/{REVISION}"
    snap.mkdir(parents=True, exist_ok=True)


def test_launch_twice_keeps_the_running_engine_and_clears_shm_only_on_a_real_launch(node):
    _weights_on_disk(node)
    script = scripts_for(node, rank=1, private_ip="10.0.0.5", head_ip="10.0.0.10")["launch"]
    # An older version's key file for the engine goes: the engine holds no key now.
    (node.root / "etc/kimi-cluster").mkdir(parents=True)
    (node.root / "etc/kimi-cluster/engine.env").write_text(f"KIMI_API_KEY={API_KEY}\n")
    ok(node.run(script))
    assert not any((node.root / "dev/shm").iterdir())
    c = node.container("kimi-engine")
    assert c["status"] == "running"
    assert "--dist-init-addr" in c["args"] and c["args"][c["args"].index("--dist-init-addr") + 1] == "10.0.0.10:20000"
    assert "NCCL_SOCKET_IFNAME=ens6" in c["env"] and "SGLANG_HOST_IP=10.0.0.5" in c["env"]
    threads = [e for e in c["env"] if e.startswith("OMP_NUM_THREADS=")][0]
    assert int(threads.split("=")[1]) == max(1, os.cpu_count() // 8)
    assert c["env_file"] is None and not (node.root / "etc/kimi-cluster/engine.env").exists()
    assert API_KEY not in json.dumps(c)

    (node.root / "dev/shm/nccl-live").write_text("in use by the running engine")
    assert "leaving it running" in ok(node.run(script))
    assert (node.root / "dev/shm/nccl-live").exists()
    assert sum(1 for c in node.calls("docker") if c[0] == "run") == 1


def test_tokenspeeds_recursive_chmod_of_the_cache_runs_only_once_the_old_engine_is_gone(node, tmp_path):
    """Issue 34, security 5: the TokenSpeed launch ran `chmod -R a+rwX` on the cache while the old engine, root in
    its container and writing that folder, still ran: a link it raced into the tree made a host file 0666. A chmod
    on PATH ahead of the real one records which engine containers run when it is called."""
    _weights_on_disk(node)
    image = "lightseekorg/tokenspeed:0.1.1@sha256:" + "ab" * 32
    spy, seen = chmod_spy(tmp_path, "kimi-engine")
    path = f"{spy}:{node.env['PATH']}"
    ok(node.run(scripts_for(node, "b300x1-tokenspeed", image=image, maxModelLen=65536)["launch"], PATH=path))
    assert node.container("kimi-engine")["status"] == "running"
    seen.unlink()
    # A changed configuration: the old engine runs until the launch removes it.
    ok(node.run(scripts_for(node, "b300x1-tokenspeed", image=image, maxModelLen=131072)["launch"], PATH=path))
    assert seen.read_text() == "chmod\n", "chmod -R ran while an engine container was running"
    assert node.container("kimi-engine")["status"] == "running"


def test_the_head_engine_listens_on_loopback_only_and_never_reads_a_key(node):
    _weights_on_disk(node)
    script = scripts_for(node)["launch"]
    assert "SECRET" not in script and "read -r" not in script
    ok(node.run(script, stdin=API_KEY))  # whatever arrives on stdin is never read
    c = node.container("kimi-engine")
    args = c["args"]
    assert args[args.index("--host") + 1] == "127.0.0.1" and "--api-key" not in args
    assert API_KEY not in json.dumps(c) and not any("API_KEY" in e for e in c["env"])


def test_a_new_vm_in_the_group_relaunches_this_rank_and_an_upgrade_leaves_the_engine_alone(node):
    _weights_on_disk(node)

    def launch(group):
        settings = make_settings("h100x4-sglang", nodeRoot=str(node.root))
        return node.run(render_node_scripts(settings, 1, "10.0.0.5", "10.0.0.10", FAST,
                                            group_vm_ids=group)["launch"])

    def runs():
        return sum(1 for c in node.calls("docker") if c[0] == "run")

    ok(launch("11 12 13 14"))
    assert (node.root / "var/lib/kimi-cluster/engine.group").read_text() == "11 12 13 14\n"
    assert "configuration and group; leaving it running" in ok(launch("11 12 13 14")) and runs() == 1
    # Node 3's VM was re-created: this rank cannot rejoin the old group, so its engine starts again.
    out = ok(launch("11 12 13 20"))
    assert "a VM of this engine group is new (the engine ran for VMs 11 12 13 14, the group is now 11 12 13 20)" in out
    assert "removing any earlier engine container" in out and runs() == 2
    assert (node.root / "var/lib/kimi-cluster/engine.group").read_text() == "11 12 13 20\n"
    # An engine launched by a release that kept no group file (0.3.2) is this group's: an upgrade keeps it serving.
    (node.root / "var/lib/kimi-cluster/engine.group").unlink()
    assert "leaving it running" in ok(launch("11 12 13 20")) and runs() == 2
    assert (node.root / "var/lib/kimi-cluster/engine.group").read_text() == "11 12 13 20\n"


def test_launch_refuses_before_the_weights_are_there(node):
    failed(node.run(scripts_for(node)["launch"]), "no snapshot at")


def test_engine_dying_at_start_up_fails_with_its_log_and_never_the_key(node_factory):
    node = node_factory(run_exits=True)
    _weights_on_disk(node)
    out = failed(node.run(scripts_for(node)["launch"], stdin=API_KEY), "the engine exited at start-up",
                 "unrecognized arguments", "API key seen: none")
    assert API_KEY not in out


def test_a_dying_engines_log_reaches_the_output_escaped(node_factory):
    """Issue 34: the engine's log tail reached `pulumi up`'s output raw, so an engine could write the operator's
    clipboard (OSC 52) or the terminal's title. It is printed through status's escape
    (kimi_cluster/node/printable.py)."""
    osc52 = "\x1b]52;c;Y3VybCBldmlsLnNoIHwgc2g=\x07"
    node = node_factory(run_exits=True, extra_env={"FAKE_RUN_LOG": f"Traceback {osc52}\x9b2J end\n"})
    _weights_on_disk(node)
    out = failed(node.run(scripts_for(node)["launch"]), "the engine exited at start-up")
    for raw in ("\x1b", "\x07", "\x9b"):
        assert raw not in out, (raw, out)
    assert "Traceback \\x1b]52;c;Y3VybCBldmlsLnNoIHwgc2g=\\x07\\x9b2J end" in out, out


def test_vllm_launch_runs_on_the_host_network_on_loopback_without_a_key(node_factory):
    node = node_factory()
    _weights_on_disk(node)
    ok(node.run(scripts_for(node, "b300x1-vllm")["launch"]))
    c = node.container("kimi-engine")
    assert not (node.root / "etc/kimi-cluster/engine.env").exists() and c["env_file"] is None
    assert c["args"][:2] == ["-c", c["args"][1]] and "vllm" in c["args"]
    assert "--network" in c["argv"] and c["argv"][c["argv"].index("--network") + 1] == "host"
    assert "-p" not in c["argv"] and c["args"][c["args"].index("--host") + 1] == "127.0.0.1"


# ---- proxy ----------------------------------------------------------------------------------------------------------

def _proxy_stdin(key: str, tls_key: str = "-----BEGIN PRIVATE KEY-----\nfake\n-----END PRIVATE KEY-----\n") -> str:
    import base64
    return f"{key}\n{base64.b64encode(tls_key.encode()).decode()}\n"


def test_proxy_step_writes_root_only_key_files_and_a_new_key_needs_no_restart(node):
    script = scripts_for(node)["proxy"]
    assert API_KEY not in script
    ok(node.run(script, stdin=_proxy_stdin(API_KEY)))
    proxy_dir = node.root / "etc/kimi-cluster/proxy"
    assert (proxy_dir / "api-key").read_text() == API_KEY
    assert "BEGIN PRIVATE KEY" in (proxy_dir / "server.key").read_text()
    for name, mode in (("api-key", 0o600), ("server.key", 0o600), ("Caddyfile", 0o644), ("ca.crt", 0o644)):
        assert stat.S_IMODE((proxy_dir / name).stat().st_mode) == mode, name
    assert stat.S_IMODE(proxy_dir.stat().st_mode) == 0o700
    assert "{file../api-key}" in (proxy_dir / "Caddyfile").read_text()
    c = node.container("kimi-proxy")
    assert c["status"] == "running" and c["args"] == ["caddy", "run", "--config", "Caddyfile", "--adapter", "caddyfile"]
    assert f"{proxy_dir}:/etc/kimi-cluster/proxy:ro" in c["argv"] and API_KEY not in json.dumps(c)
    # Same configuration, new key: the file changes, the container stays.
    out = ok(node.run(script, stdin=_proxy_stdin("rotated-key")))
    assert "already runs with this configuration" in out and "rotated-key" not in out
    assert (proxy_dir / "api-key").read_text() == "rotated-key"
    assert sum(1 for c in node.calls("docker") if c[0] == "run") == 1
    # A new TLS key (a new certificate) restarts the proxy.
    ok(node.run(script, stdin=_proxy_stdin("rotated-key", "-----BEGIN PRIVATE KEY-----\nother\n")))
    assert sum(1 for c in node.calls("docker") if c[0] == "run") == 2


def test_proxy_step_refuses_without_a_key_or_a_tls_key(node):
    script = scripts_for(node)["proxy"]
    failed(node.run(script, stdin=""), "no API key arrived on stdin")
    failed(node.run(script, stdin=API_KEY + "\n"), "no TLS private key arrived on stdin")
    assert node.container("kimi-proxy") is None


# ---- readiness ----------------------------------------------------------------------------------------------------

class _Engine(http.server.BaseHTTPRequestHandler):
    """The proxy as readiness sees it: /health open, /v1/models only with the key (or `open_models`: without)."""

    key = API_KEY
    served = "moonshotai/Kimi-K3.1-Pro"
    health_after = 0.0
    started = 0.0
    open_models = False

    def log_message(self, *a):
        pass

    def do_GET(self):
        import time
        if self.path == "/health":
            code = 200 if time.time() - self.started >= self.health_after else 502
            self._send(code, b"")
        elif self.path == "/v1/models":
            if not self.open_models and self.headers.get("Authorization") != f"Bearer {self.key}":
                self._send(401, b'{"error": "unauthorized"}')
            else:
                self._send(200, json.dumps({"object": "list", "data": [{"id": self.served}]}).encode())
        else:
            self._send(404, b"")

    def _send(self, code, body):
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


PUBLIC_IP = "198.51.100.10"


def _tls_server(tmp_path, handler, ip=PUBLIC_IP, ca=None):
    """An https server on loopback with a certificate for the head's public address, signed by `ca` (made here)."""
    import ssl

    from kimi_cluster.deploy import tls
    ca_pem, ca_key = ca or tls.make_ca("readiness test CA")
    cert, key = tls.make_server_certificate(ca_pem, ca_key, [ip])
    (tmp_path / "cert.pem").write_text(cert)
    (tmp_path / "key.pem").write_text(key)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tmp_path / "cert.pem", tmp_path / "key.pem")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, ca_pem


def _trust(node, ca_pem):
    """What the proxy step leaves for readiness: the CA, in the proxy's directory."""
    d = node.root / "etc/kimi-cluster/proxy"
    d.mkdir(parents=True, exist_ok=True)
    (d / "ca.crt").write_text(ca_pem)


@pytest.fixture
def proxy_server(tmp_path):
    import time
    made = []

    def make(**attrs):
        handler = type("Engine", (_Engine,), {"started": time.time(), "health_after": 1.0, **attrs})
        server, ca = _tls_server(tmp_path, handler, ca=attrs.pop("ca", None) if "ca" in attrs else None)
        made.append(server)
        return server, ca

    yield make
    for server in made:
        server.shutdown()
        server.server_close()


def _running_container(node):
    _weights_on_disk(node)
    ok(node.run(scripts_for(node)["launch"]))


def _readiness(node, port, timing=FAST):
    settings = make_settings(nodeRoot=str(node.root), apiPort=port)
    return render_step(settings, "readiness", 0, "x", "x", timing, public_ip=PUBLIC_IP)


needs_curl = pytest.mark.skipif(shutil.which("curl") is None, reason="the readiness step polls with curl")


@needs_curl
def test_readiness_waits_for_health_then_the_model_over_tls_with_the_key(node, proxy_server):
    _running_container(node)
    server, ca = proxy_server()
    _trust(node, ca)
    script = _readiness(node, server.server_address[1])
    out = ok(node.run(script, stdin=API_KEY))
    assert "/health answers" in out and f"ready: https://{PUBLIC_IP}:" in out and "401 without the key" in out
    assert API_KEY not in script and API_KEY not in out
    header = node.root / "etc/kimi-cluster/api-auth.header"
    assert stat.S_IMODE(header.stat().st_mode) == 0o600


class _Replica(_Engine):
    """A replica's engine as its engine-ready step and the front ask it: /health, then /v1/models, no key.

    `health` scripts the answers to /health once the model has been listed (200 or 502, the last one repeats), so a
    test can drop the engine right after it first serves; `after_listing` counts the /health checks since."""

    open_models = True
    health: tuple[int, ...] = (200,)
    listed = False
    after_listing = 0

    def do_GET(self):
        cls = type(self)
        if self.path == "/health" and cls.listed:
            code = cls.health[min(cls.after_listing, len(cls.health) - 1)]
            cls.after_listing += 1
            self._send(code, b"")
            return
        cls.listed = cls.listed or self.path == "/v1/models"
        super().do_GET()


def _engine_ready(node, health):
    """Run replica 0's engine-ready step against a local engine whose /health answers `health` after it serves."""
    handler = type("Replica", (_Replica,), {"health": health})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        settings = make_settings(nodeRoot=str(node.root), replicas="2", enginePort=str(server.server_address[1]))
        return node.run(render_step(settings, "engine-ready", 0, "127.0.0.1", "127.0.0.1", FAST)), handler
    finally:
        server.shutdown()
        server.server_close()


@needs_curl
def test_engine_ready_holds_until_the_front_can_have_taken_the_replica_back(node):
    """The next replica restarts once this step passes, so it passes only after the run of good /health checks the
    front needs to take this replica back (FrontTuning.readmit_checks, one health_interval apart)."""
    from kimi_cluster.plan.front_tuning import FrontTuning

    _running_container(node)
    result, handler = _engine_ready(node, (200,))
    out = ok(result)
    assert f"/health held {FrontTuning().readmit_checks} checks" in out
    assert handler.after_listing >= FrontTuning().readmit_checks


@needs_curl
def test_engine_ready_starts_over_when_the_engine_drops_right_after_it_first_serves(node):
    from kimi_cluster.plan.front_tuning import FrontTuning

    _running_container(node)
    result, handler = _engine_ready(node, (200, 502, 200))
    ok(result)
    # One good check, the drop, then a whole new run of good ones before the step let the next replica restart.
    assert handler.after_listing >= 2 + FrontTuning().readmit_checks


@needs_curl
def test_readiness_with_a_wrong_key_fails_fast_with_the_engine_log(node, proxy_server):
    _running_container(node)
    server, ca = proxy_server()
    _trust(node, ca)
    out = failed(node.run(_readiness(node, server.server_address[1]), stdin="not-the-key"),
                 "refuses the stack's API key", "last lines of the engine log")
    assert "not-the-key" not in out


@needs_curl
def test_readiness_fails_when_the_models_list_answers_without_the_key(node, proxy_server):
    _running_container(node)
    server, ca = proxy_server(open_models=True)
    _trust(node, ca)
    failed(node.run(_readiness(node, server.server_address[1]), stdin=API_KEY),
           "answers /v1/models without the key with HTTP 200, not 401")


@needs_curl
def test_readiness_never_accepts_a_certificate_from_another_ca(node, proxy_server):
    from kimi_cluster.deploy import tls

    _running_container(node)
    server, _ = proxy_server()
    _trust(node, tls.make_ca("someone else's CA")[0])
    failed(node.run(_readiness(node, server.server_address[1], QUICK_GIVE_UP), stdin=API_KEY),
           "gave up after 1 s", "SSL certificate problem")


@needs_curl
def test_readiness_gives_up_at_its_deadline_and_prints_the_log(node):
    from kimi_cluster.deploy import tls

    _running_container(node)
    _trust(node, tls.make_ca("readiness test CA")[0])
    failed(node.run(_readiness(node, 1, QUICK_GIVE_UP), stdin=API_KEY),
           f"gave up after 1 s waiting for https://{PUBLIC_IP}:1/health", "fake engine kimi-engine started")


# ---- the command pulumi-command runs ------------------------------------------------------------------------------

def test_the_remote_command_runs_the_script_with_stdin_through_sudo(node):
    _weights_on_disk(node)
    script = scripts_for(node)["launch"]
    command = remote_command_text("launch", script, deadline_s=60)
    assert API_KEY not in command
    ok(node.shell(command))
    assert (node.root / "home/ubuntu/.kimi-cluster/launch.sh").read_text() == script
    assert node.container("kimi-engine")["status"] == "running"


def test_a_relative_node_root_is_taken_from_the_ssh_login_directory(node):
    # The login directory is <root>/home/ubuntu, so "../.." is the node root; the command runs from there.
    settings = make_settings(nodeRoot="../..")
    command = remote_command_text("storage", render_step(settings, "storage", 0, "10.0.0.5", "10.0.0.5", FAST),
                                  deadline_s=60)
    ok(node.shell(command))
    assert node.docker_state()["root"] == str(node.root / "ephemeral/docker")


# ---- the readiness wait against a proxy that fails open -------------------------------------------------------


class _EmptyBearerOpens(_Engine):
    """A proxy that fails open: an `Authorization: Bearer` with nothing after it passes, as with an empty key file."""

    def do_GET(self):
        if self.path == "/v1/models" and self.headers.get("Authorization", "").strip() == "Bearer":
            self.headers.replace_header("Authorization", f"Bearer {self.key}")
        _Engine.do_GET(self)


@needs_curl
def test_readiness_fails_when_an_empty_bearer_is_let_through(node, proxy_server):
    _running_container(node)
    server, ca = proxy_server(do_GET=_EmptyBearerOpens.do_GET)
    _trust(node, ca)
    failed(node.run(_readiness(node, server.server_address[1]), stdin=API_KEY),
           "answers /v1/models with an empty bearer over HTTP/2 with HTTP 200, not 401")


@needs_curl
def test_readiness_passes_a_proxy_that_refuses_the_empty_bearer(node, proxy_server):
    _running_container(node)
    server, ca = proxy_server()
    _trust(node, ca)
    out = ok(node.run(_readiness(node, server.server_address[1]), stdin=API_KEY))
    assert "and to an empty bearer" in out


def test_the_render_servers_log_reaches_the_output_escaped(node_factory):
    """Issue 52: the resume step printed the render server's log tail raw into `pulumi up`'s output, as the engine's
    once was (above); every log tail of every step goes through status's escape (tests/plan/test_log_tails.py)."""
    from kimi_cluster.plan.steps.model import VmSpot
    from kimi_cluster.plan.steps.scripts import render_vm_scripts

    osc52 = "\x1b]52;c;Y3VybCBldmlsLnNoIHwgc2g=\x07"
    erase = "\x1b[2K\x1b[1G"  # the line so far erased: what follows would pass for the step's own line
    log = f"Traceback {osc52}{erase}[kimi] forged\x9b2J end\n"
    node = node_factory(run_exits=True, extra_env={"FAKE_RUN_LOG": log})
    settings = make_settings("b300x1-vllm", replicas="2", nodeRoot=str(node.root))
    front = next(vm for vm in blueprint(settings, "kimi").vm_plans if vm.kind == "front")
    script = render_vm_scripts(compile_steps(settings), front, VmSpot(private_ip="10.0.0.2",
                                                                      front_upstreams=["10.0.0.21"]),
                               ["resume"], replace(FAST, proxy_timeout_s=2))["resume"]
    out = failed(node.run(script, stdin="\n"), "vLLM's render server did not start")
    for raw in ("\x1b", "\x07", "\x9b"):
        assert raw not in out, (raw, out)
    assert "Traceback \\x1b]52;c;Y3VybCBldmlsLnNoIHwgc2g=\\x07\\x1b[2K\\x1b[1G[kimi] forged\\x9b2J end" in out, out
