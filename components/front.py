"""The front (replicas >= 2): one small CPU VM whose Caddy holds the endpoint and load-balances over every replica.

It runs the same pinned Caddy and the same bearer check as a head's proxy (components/proxy.py), with the replicas'
engines as upstreams on the private network: active /health checks, passive failover, and a retry on another
replica for any request that failed before its response started (POST included: an inference request has no side
effect on the server). It holds the API key; no replica does. Its public address is the endpoint, so losing or
replacing a replica never changes the URL. Its Caddyfile and scripts: components/front_config.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import pulumi

from components import firewall
from components.blueprint import FrontArgs
from components.hyperstack.resources import VirtualMachine
from components.node_chain import EndpointKeys, Readiness
from components.remote_step import node_connection, remote_command_text, remote_step

FRONT_TYPE = "kimi:cluster:Front"


class Front(pulumi.ComponentResource):
    """The front's rules, its proxy step and the readiness wait through it (the endpoint's only gate)."""

    proxy: pulumi.Resource
    ready: Readiness

    def __init__(
        self,
        name: str,
        *,
        args: FrontArgs,
        vm: VirtualMachine,
        host_key: pulumi.Input[str],
        ssh_private_key: pulumi.Input[str],
        endpoint: EndpointKeys,
        head_private_ips: Sequence[pulumi.Input[str]],
        wait_for: Sequence[pulumi.Resource] = (),
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__(FRONT_TYPE, name, None, opts)
        # With assign_floating_ip=True a VM's create returns only once its floating IP is attached.
        public_ip = cast(pulumi.Output[str], vm.public_ip)
        rules = firewall.security_rules(self, name, vm, args.rules)
        connection = node_connection(public_ip, args.ssh_user, ssh_private_key, host_key)
        tls = endpoint.public_tls()
        ips = pulumi.Output.all(*head_private_ips)

        def step(step_name: str, depends_on: Sequence[pulumi.Resource],
                 stdin: pulumi.Output[str] | None = None) -> pulumi.Resource:
            clock = args.clocks[step_name]
            text = pulumi.Output.all(tls, ips, vm.vm_id).apply(lambda a: remote_command_text(
                step_name, args.render(step_name, a[1], a[0]), deadline_s=clock.deadline_s, vm_id=a[2]))
            return remote_step(self, f"{name}-{step_name}", text, connection, list(depends_on), stdin, clock.timeout)

        ready = step("front-ready", rules)
        # It may start at once: until a replica answers /health it serves 502s, and 401s without the key.
        self.proxy = step("proxy", [ready], stdin=endpoint.proxy_stdin())
        # Through the front, over TLS with the key: runs again when a launch or a replica's address changes.
        self.ready = Readiness(f"{name}-ready", args=args.wait, public_ip=public_ip, ssh_private_key=ssh_private_key,
                               endpoint=endpoint, host_key=host_key, identity=ips.apply(args.identity),
                               opts=pulumi.ResourceOptions(parent=self, depends_on=[self.proxy, *wait_for]))
        self.register_outputs({})
