"""The front (replicas >= 2): one small CPU VM whose Caddy holds the endpoint and load-balances over every replica.

It runs the same pinned Caddy and the same bearer check as a head's proxy (components/proxy.py), with the replicas'
engines as upstreams on the private network: active /health checks, passive failover, and a retry on another
replica for any request that failed before its response started (POST included: an inference request has no side
effect on the server). It holds the API key; no replica does. Its public address is the endpoint, so losing or
replacing a replica never changes the URL.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import cast

import pulumi

from components import catalog, firewall, proxy
from components.front_tuning import DEFAULT_TUNING, FrontTuning
from components.hyperstack.resources import SecurityRule, VirtualMachine
from components.node import (
    ProxyTls,
    Readiness,
    _command,
    _proxy_stdin,
    _values,
    host_key_user_data,
    node_connection,
    readiness_identity,
    remote_command_text,
)
from components.render import render
from components.settings import Settings
from components.timing import Timing

FRONT_TYPE = "kimi:cluster:Front"
FRONT_STEPS = ("front-ready", "proxy")  # then the readiness wait through it


def upstreams(settings: Settings, head_private_ips: Sequence[str]) -> list[str]:
    """Each replica's engine: its head's private address and enginePort (the engine binds that address)."""
    return [f"{ip}:{settings.engine_port}" for ip in head_private_ips]


def caddyfile(settings: Settings, head_private_ips: Sequence[str], tuning: FrontTuning = DEFAULT_TUNING) -> str:
    """The front's Caddyfile. It holds no secret: the key and the TLS private key are files next to it."""
    for ip in head_private_ips:
        # Addresses come from the API; anything but an address would be Caddyfile syntax.
        if not all(c.isalnum() or c in ".:[]<>-" for c in ip):
            raise ValueError(f"replica head address {ip!r} is not an IP address")
    return render("front.Caddyfile.j2", version=catalog.PROXY_VERSION, api_port=int(settings.api_port),
                  admin_socket=proxy.ADMIN_SOCKET,
                  upstreams=upstreams(settings, head_private_ips), key_file=proxy.KEY_FILE,
                  cert_file=proxy.CERT_FILE, tls_key_file=proxy.TLS_KEY_FILE,
                  unauthorized_body=proxy.UNAUTHORIZED_BODY, **tuning.__dict__)


def render_front_step(settings: Settings, step: str, head_private_ips: Sequence[str], tls: ProxyTls,
                      timing: Timing | None = None, tuning: FrontTuning = DEFAULT_TUNING) -> str:
    """One of the front's scripts: `front-ready` (cloud-init, Docker) or `proxy` (the load-balancing Caddy)."""
    timing = settings.timing if timing is None else timing  # kimi-cluster:nodeTiming (tests pass shorter ones)
    v = _values(settings, 0, step, timing)
    if step == "front-ready":
        v.update(cloud_init_timeout_s=timing.cloud_init_timeout_s, docker_timeout_s=timing.docker_timeout_s)
        return render("front-ready.sh.j2", **v)
    if step != "proxy":
        raise ValueError(f"the front runs {', '.join(FRONT_STEPS)} and readiness, not {step!r}")
    config = caddyfile(settings, head_private_ips, tuning)
    v.update(proxy.step_values(settings, tls.cert_chain_pem, tls.ca_pem, config,
                               " ".join(upstreams(settings, head_private_ips)), timing.proxy_settle_seconds,
                               admin=True))
    return render("proxy.sh.j2", **v)


def front_rules(settings: Settings) -> list[firewall.RuleSpec]:
    """SSH from the operator, and the API port from each of apiAllowedCidrs: the only public door to the model."""
    return firewall.operator_rules(settings, 0)


def front_vm(parent: pulumi.Resource, name: str, settings: Settings, *, environment_name: pulumi.Input[str],
             region: pulumi.Input[str], key_name: pulumi.Input[str]) -> tuple[VirtualMachine, pulumi.Output[str]]:
    """The front's VM and its pinned host key. Made before the Front: its public address goes into the
    certificate, and its private one into every replica's engine rule."""
    user_data, host_key = host_key_user_data(name, opts=pulumi.ResourceOptions(parent=parent))
    vm = VirtualMachine(
        name, name=settings.front_name, environment_name=environment_name, region=region,
        flavor_name=settings.front_flavor, image_name=settings.front_vm_image, key_name=key_name,
        labels=["kimi-cluster", f"stack-{settings.stack}", "role-front"], user_data=user_data,
        assign_floating_ip=True, opts=pulumi.ResourceOptions(parent=parent))
    return vm, host_key


class Front(pulumi.ComponentResource):
    """The front's rules, its proxy step and the readiness wait through it (the endpoint's only gate)."""

    proxy: pulumi.Resource
    ready: Readiness

    def __init__(
        self,
        name: str,
        *,
        settings: Settings,
        vm: VirtualMachine,
        host_key: pulumi.Input[str],
        ssh_private_key: pulumi.Input[str],
        api_key: pulumi.Input[str],
        tls_cert_chain: pulumi.Input[str],
        tls_ca: pulumi.Input[str],
        tls_private_key: pulumi.Input[str],
        head_private_ips: Sequence[pulumi.Input[str]],
        wait_for: Sequence[pulumi.Resource] = (),
        timing: Timing | None = None,
        tuning: FrontTuning = DEFAULT_TUNING,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__(FRONT_TYPE, name, None, opts)
        timing = settings.timing if timing is None else timing  # kimi-cluster:nodeTiming (tests pass shorter ones)
        child = pulumi.ResourceOptions(parent=self)
        # With assign_floating_ip=True a VM's create returns only once its floating IP is attached.
        public_ip = cast(pulumi.Output[str], vm.public_ip)
        rules = [SecurityRule(f"{name}-{spec.key}", vm_id=vm.vm_id, direction="ingress", protocol=spec.protocol,
                              ethertype=spec.ethertype, remote_ip_prefix=spec.remote_ip_prefix,
                              port_range_min=spec.port_range_min, port_range_max=spec.port_range_max, opts=child)
                 for spec in front_rules(settings)]
        connection = node_connection(public_ip, settings.ssh_user, ssh_private_key, host_key)
        tls = pulumi.Output.all(tls_cert_chain, tls_ca).apply(lambda t: ProxyTls(t[0], t[1]))
        ips = pulumi.Output.all(*head_private_ips)

        def step(step_name: str, depends_on: Sequence[pulumi.Resource],
                 stdin: pulumi.Output[str] | None = None) -> pulumi.Resource:
            deadline = timing.deadline_s(step_name, settings)
            text = pulumi.Output.all(tls, ips, vm.vm_id).apply(lambda a: remote_command_text(
                step_name, render_front_step(settings, step_name, a[1], a[0], timing, tuning),
                deadline_s=deadline, vm_id=a[2]))
            return _command(self, f"{name}-{step_name}", text, connection, list(depends_on), stdin,
                            timing.custom_timeout(step_name, settings))

        ready = step("front-ready", rules)
        # It may start at once: until a replica answers /health it serves 502s, and 401s without the key.
        self.proxy = step("proxy", [ready], stdin=_proxy_stdin(api_key, tls_private_key))
        # Through the front, over TLS with the key: runs again when a launch or a replica's address changes.
        identity = ips.apply(lambda a: readiness_identity(settings) + "-" +
                             hashlib.sha256(" ".join(a).encode()).hexdigest()[:16])
        self.ready = Readiness(f"{name}-ready", settings=settings, public_ip=public_ip,
                               ssh_private_key=ssh_private_key, api_key=api_key, tls_cert_chain=tls_cert_chain,
                               tls_ca=tls_ca, host_key=host_key, timing=timing, container=proxy.CONTAINER_NAME,
                               identity=identity,
                               opts=pulumi.ResourceOptions(parent=self, depends_on=[self.proxy, *wait_for]))
        self.register_outputs({})
