"""The head's one authenticating TLS proxy (Caddy): its configuration and its `docker run`, as data, in one place.

The engine listens on the head's loopback only and holds no API key; the proxy serves TLS on apiPort, lets `/health`
through, and forwards every other request only with `Authorization: Bearer <key>` (anything else gets 401 from the
proxy, so no engine route, `/invocations` or `/tokenize` included, is reachable without the key), and with it only
the public API (PUBLIC_PATHS; the front has the same door). The key is a
root-only file the proxy reads on every request: a rotated key takes effect the moment the file is replaced, with no
restart of the proxy or the engine. Shared by the proxy step's template and the offline plan.
"""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass

from kimi_cluster.plan.jinja import ShellExpr, render, shell_words
from kimi_cluster.settings import catalog

CONTAINER_NAME = "kimi-proxy"
FINGERPRINT_LABEL = "kimi-cluster.proxy-fingerprint"
# Inside the container the proxy's directory is its working directory, and the configuration names every file
# relative to it, so the same configuration works wherever the directory sits on the host.
CONTAINER_DIR = "/etc/kimi-cluster/proxy"
CONFIG_FILE = "Caddyfile"
KEY_FILE = "api-key"
CERT_FILE = "server.crt"
TLS_KEY_FILE = "server.key"
CA_FILE = "ca.crt"
PLACEHOLDER_FINGERPRINT = ShellExpr("${FINGERPRINT}")
# The front's graceful reload (kimi_cluster/deploy/front.py): Caddy's admin API on a unix socket in a writable run/
# directory.
RUN_LABEL = "kimi-cluster.proxy-run"
ADMIN_DIR = "run"
ADMIN_SOCKET = f"{ADMIN_DIR}/admin.sock"
# The caretaker's files (idleStopMinutes, budgetUsd): the one directory the proxy writes (its access log) and reads
# the caretaker's 503 answer and budget warning from (kimi_cluster/plan/templates/_caretaker.Caddyfile.j2).
CARETAKER_DIR = "caretaker"
# What a key holder reaches on an engine, through a head's proxy or the front (templates/_authorized.Caddyfile.j2):
# the OpenAI and Anthropic routes the client configs (kimi_cluster/plan/client_configs.py) and the verifier's checks
# (kimi_cluster/checks/) call, with Claude Code's token count and the legacy completions, and the Prometheus
# counters `status` reads. Every other engine route answers 404 at the proxy: vLLM 0.33's token API
# (/inference/v1/generate, only the front's resuming layer calls it, on the replicas' private addresses), its
# aborts by request id (/inference/v1/abort_requests, /abort_requests), render and derender, /invocations, the
# tokenizer's and the admin routes (vllm/entrypoints/serve/dev/, rl/), and SGLang's and TokenSpeed's own
# (/flush_cache, /update_weights_from_disk, /abort_request, ...). /health has its own open door (_health.Caddyfile.j2).
PUBLIC_PATHS = ("/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/messages/count_tokens",
                "/v1/models", "/metrics")
NOT_FOUND_BODY = ('{"error":{"message":"not found: this endpoint serves ' + ", ".join(PUBLIC_PATHS)
                  + ' and /health","type":"not_found_error","code":404}}')
UNAUTHORIZED_BODY = '{"error":{"message":"missing or invalid API key","type":"authentication_error","code":401}}'


@dataclass(frozen=True)
class EndpointInputs:
    """What the endpoint's proxy (a head's, or the front's) is made of: the settings' values of the same names."""

    api_port: int
    engine_port: int
    engine_name: str
    guarded: bool  # the caretaker runs: the proxy logs what it counts and answers its 503
    proxy_container_image: str
    resumes_streams: bool  # the front hands the chat requests to its resuming layer
    hours: bool = False  # kimi-cluster:schedule: the caretaker's 503 outside the hours carries a Retry-After
    early_start: bool = False  # schedule.earlyStart: a keyed POST /kimi/early-start outside the hours asks for an up


def upstream(endpoint: EndpointInputs) -> str:
    """Where the engine listens: the head's loopback, never an interface the firewall could open."""
    return f"127.0.0.1:{endpoint.engine_port}"


def metrics_upstream(endpoint: EndpointInputs) -> str | None:
    """Where /metrics lives when it is not on the engine's port: TokenSpeed's gateway has a listener for it."""
    if endpoint.engine_name != "tokenspeed":
        return None
    return f"127.0.0.1:{endpoint.engine_port + catalog.TOKENSPEED_METRICS_PORT_OFFSET}"


def render_config(endpoint: EndpointInputs) -> str:
    """The Caddyfile. It holds no secret: the key and the TLS private key are files next to it."""
    return caddyfile(endpoint.api_port, upstream(endpoint), metrics_upstream(endpoint), caretaker=endpoint.guarded,
                     hours=endpoint.hours, early_start=endpoint.early_start)


def caddyfile(api_port: int, upstream_address: str, metrics_address: str | None = None,
              caretaker: bool = False, hours: bool = False, early_start: bool = False) -> str:
    """The Caddyfile for a proxy on `api_port` in front of `upstream_address` (HOST:PORT), with /metrics sent to
    `metrics_address` when the engine serves it elsewhere; `caretaker`: its access log, 503 and budget warning
    (kimi_cluster/plan/templates/_caretaker.Caddyfile.j2)."""
    return render("proxy.Caddyfile.j2", version=catalog.PROXY_VERSION, api_port=int(api_port),
                  upstream=upstream_address, key_file=KEY_FILE, cert_file=CERT_FILE, tls_key_file=TLS_KEY_FILE,
                  unauthorized_body=UNAUTHORIZED_BODY, not_found_body=NOT_FOUND_BODY, public_paths=PUBLIC_PATHS,
                  metrics_upstream=metrics_address or "", caretaker=caretaker, hours=hours,
                  early_start=early_start)


def docker_run_argv(endpoint: EndpointInputs, proxy_dir: str | ShellExpr,
                    fingerprint: str | ShellExpr | None = PLACEHOLDER_FINGERPRINT, admin: bool = False) -> list:
    """`docker run` of the proxy: host network (it must bind apiPort on the public side and reach the engine on
    loopback), the proxy's directory mounted read-only as its working directory, the official image's caddy.

    `admin` (the front): a writable run/ inside it for Caddy's admin socket, so a new upstream list is a graceful
    `caddy reload` (in-flight requests finish) instead of a restart; the socket is in the root-only proxy directory.
    """
    items: list = [("docker", "run", "-d"), ("--name", CONTAINER_NAME), ("--restart", "unless-stopped")]
    if fingerprint is not None:
        label = f"{FINGERPRINT_LABEL}={fingerprint}"
        items.append(("--label", ShellExpr(label) if isinstance(fingerprint, ShellExpr) else label))
    if admin and fingerprint is not None:
        items.append(("--label", f"{RUN_LABEL}={run_fingerprint(endpoint)}"))
    mount = f"{proxy_dir}:{CONTAINER_DIR}:ro"
    items += [
        ("--network", "host"),
        ("--log-opt", "max-size=50m"), ("--log-opt", "max-file=3"),
        ("-v", ShellExpr(mount) if isinstance(proxy_dir, ShellExpr) else mount),
    ]
    if admin:
        run_mount = f"{proxy_dir}/{ADMIN_DIR}:{CONTAINER_DIR}/{ADMIN_DIR}"
        items.append(("-v", ShellExpr(run_mount) if isinstance(proxy_dir, ShellExpr) else run_mount))
    if endpoint.guarded:
        care_mount = f"{proxy_dir}/{CARETAKER_DIR}:{CONTAINER_DIR}/{CARETAKER_DIR}"
        items.append(("-v", ShellExpr(care_mount) if isinstance(proxy_dir, ShellExpr) else care_mount))
    items += [
        ("-w", CONTAINER_DIR),
        endpoint.proxy_container_image,
        ("caddy", "run", "--config", CONFIG_FILE, "--adapter", "caddyfile"),
    ]
    return items


def proxy_fingerprint(endpoint: EndpointInputs, cert_chain_pem: str, ca_pem: str, config: str | None = None) -> str:
    """Names one proxy configuration (config, certificates, image); the API key is not part of it, since a new key
    needs no restart. A running proxy with the same label is left alone."""
    argv = docker_run_argv(endpoint, ShellExpr("${PROXY_DIR}"), fingerprint=None)
    text = "\n".join([render_config(endpoint) if config is None else config, cert_chain_pem, ca_pem,
                      shell_words(argv)])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def run_fingerprint(endpoint: EndpointInputs) -> str:
    """Names how the front's proxy container runs (image, mounts, flags), not its configuration: while it matches,
    a new configuration is reloaded into the running Caddy."""
    argv = docker_run_argv(endpoint, ShellExpr("${PROXY_DIR}"), fingerprint=None, admin=True)
    return hashlib.sha256(shell_words(argv).encode()).hexdigest()[:16]


def reload_argv() -> list:
    """`docker exec` of a graceful reload in the running proxy: Caddy's own `reload` through its admin socket."""
    return [("docker", "exec", CONTAINER_NAME), ("caddy", "reload"), ("--config", CONFIG_FILE),
            ("--adapter", "caddyfile"), ("--address", f"unix/{ADMIN_SOCKET}")]


def step_values(endpoint: EndpointInputs, cert_chain_pem: str, ca_pem: str, config: str, upstream_text: str,
                settle_seconds: float, admin: bool = False) -> dict[str, object]:
    """The proxy step's template values for one Caddyfile: a head's (render_config) or the front's (admin: it
    reloads a new configuration into the running Caddy)."""
    return dict(container=CONTAINER_NAME, api_port=endpoint.api_port, upstream=upstream_text,
                reload=admin, run_label=RUN_LABEL, run_fingerprint=run_fingerprint(endpoint) if admin else "",
                reload_argv=reload_argv(), admin_dir=ADMIN_DIR, caretaker_dir=CARETAKER_DIR if endpoint.guarded else "",
                config_b64=_b64(config), cert_b64=_b64(cert_chain_pem), ca_b64=_b64(ca_pem),
                config_file=CONFIG_FILE, cert_file=CERT_FILE, ca_file=CA_FILE, tls_key_file=TLS_KEY_FILE,
                key_file=KEY_FILE, fingerprint=proxy_fingerprint(endpoint, cert_chain_pem, ca_pem, config),
                fingerprint_label=FINGERPRINT_LABEL, settle_seconds=settle_seconds,
                docker_argv=docker_run_argv(endpoint, ShellExpr("${PROXY_DIR}"), admin=admin))


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def command_text(endpoint: EndpointInputs) -> str:
    """The proxy's launch command for the plan, with a real node's paths."""
    return shell_words(docker_run_argv(endpoint, "/etc/kimi-cluster/proxy", fingerprint=None),
                       continuation=" \\\n  ")
