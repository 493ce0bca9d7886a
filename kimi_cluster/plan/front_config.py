"""The front's configuration (replicas >= 2), pure: its Caddyfile, its upstreams and its rules.

The front's Caddy holds the endpoint and load-balances over every replica's engine (kimi_cluster/deploy/front.py makes
the
resources, kimi_cluster/plan/step_scripts.py renders its two scripts); nothing here makes a resource, so the offline
plan
shows the same text the front runs.
"""

from __future__ import annotations

from collections.abc import Sequence

from kimi_cluster.plan import firewall, proxy, resume
from kimi_cluster.plan.front_tuning import DEFAULT_TUNING, FrontTuning
from kimi_cluster.plan.jinja import render
from kimi_cluster.plan.proxy import EndpointInputs
from kimi_cluster.settings import catalog

FRONT_STEPS = ("front-ready", "proxy")  # then the readiness wait through it


def upstreams(endpoint: EndpointInputs, head_private_ips: Sequence[str]) -> list[str]:
    """Each replica's engine: its head's private address and enginePort (the engine binds that address)."""
    return [f"{ip}:{endpoint.engine_port}" for ip in head_private_ips]


def caddyfile(endpoint: EndpointInputs, head_private_ips: Sequence[str], tuning: FrontTuning = DEFAULT_TUNING) -> str:
    """The front's Caddyfile. It holds no secret: the key and the TLS private key are files next to it."""
    for ip in head_private_ips:
        # Addresses come from the API; anything but an address would be Caddyfile syntax.
        if not all(c.isalnum() or c in ".:[]<>-" for c in ip):
            raise ValueError(f"replica head address {ip!r} is not an IP address")
    return render("front.Caddyfile.j2", version=catalog.PROXY_VERSION, api_port=int(endpoint.api_port),
                  admin_socket=proxy.ADMIN_SOCKET,
                  upstreams=upstreams(endpoint, head_private_ips), key_file=proxy.KEY_FILE,
                  cert_file=proxy.CERT_FILE, tls_key_file=proxy.TLS_KEY_FILE,
                  unauthorized_body=proxy.UNAUTHORIZED_BODY, not_found_body=proxy.NOT_FOUND_BODY,
                  public_paths=proxy.PUBLIC_PATHS, caretaker=endpoint.guarded, hours=endpoint.hours,
                  early_start=endpoint.early_start,
                  resume_to=resume.resume_address() if endpoint.resumes_streams else "", **tuning.__dict__)


def front_rules(fw: firewall.FirewallInputs) -> list[firewall.RuleSpec]:
    """SSH from the operator, and the API port from each of apiAllowedCidrs: the only public door to the model."""
    return firewall.operator_rules(fw, 0)
