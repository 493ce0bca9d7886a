"""InferenceCluster: the whole deployment as one component, from environment to a ready endpoint.

Environment and keypair, every replica's VMs (one replica: the plain stack), least-privilege rules, the per-node
bring-up chains, the endpoint's TLS certificate and proxy (on replica 0's head, or on the front when replicas >= 2),
the readiness wait through it, and the outputs other teams consume. The settings are read once, into a blueprint
(components/blueprint.py); this is the graph only: behaviour lives in the providers and templates.
"""

from __future__ import annotations

from typing import Any, cast

import pulumi

from components import caretaker, front, replicas, tls
from components.blueprint import blueprint
from components.generated_secret import GeneratedSecret
from components.hyperstack.placement import Placement
from components.hyperstack.resources import Environment
from components.node import vm_place, vm_with_host_key
from components.node_chain import EndpointKeys, NodeSecrets
from components.pricing import Quote
from components.release import VERSION_OUTPUT, __version__
from components.settings import Settings
from components.step_scripts import NodeSpot


class InferenceCluster(pulumi.ComponentResource):
    """Creates everything `pulumi up` bills for; `pulumi destroy` removes it in reverse, leaving nothing."""

    outputs: dict[str, Any]

    def __init__(
        self,
        name: str,
        settings: Settings,
        ssh_private_key: pulumi.Output[str],
        hf_token: pulumi.Output[str] | None,
        kernel_cache_credentials: pulumi.Output[str] | None = None,
        tls_private_key: pulumi.Output[str] | None = None,
        opts: pulumi.ResourceOptions | None = None,
        quote: Quote | None = None,
        caretaker_api_key: pulumi.Output[str] | None = None,
    ) -> None:
        super().__init__("kimi:cluster:InferenceCluster", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        bp = blueprint(settings, name, quote)

        # Chosen once from live stock, then kept: everything billable hangs off this region.
        placement = Placement(f"{name}-placement", opts=child, **bp.placement)
        env = Environment(f"{name}-env", name=bp.env_name, region=placement.region, opts=child)
        # The endpoint never runs unauthenticated: the key is generated once and exported only as a secret; a new
        # apiKeyVersion makes a new one.
        api_key = GeneratedSecret(f"{name}-api-key", version=bp.api_key_version, opts=child)
        # Wrapped explicitly so the key stays secret however the engine treats additional_secret_outputs.
        api_key_value: pulumi.Output[str] = pulumi.Output.secret(api_key.value)
        # Nodes serve each other the weight files they fetched from the hub, behind this per-stack token; its peers
        # are every GPU node of every replica.
        peer_token: pulumi.Output[str] | None = None
        if bp.fan_out > 1:
            peer_token = pulumi.Output.secret(GeneratedSecret(f"{name}-peer-token", opts=child).value)
        place = vm_place(self, name, env, placement.region, env_name=bp.env_name, keypair_name=bp.keypair_name,
                         ssh_public_key=bp.ssh_public_key)
        groups = [replicas.replica_vms(self, r, place) for r in bp.replicas]
        # The endpoint's VM: the front (replicas >= 2) or replica 0's head. Its public address is in the certificate.
        door = None
        if bp.front_vm is not None:
            f = bp.front_vm
            door = vm_with_host_key(self, f.resource_name, place, name=f.name, flavor_name=f.flavor_name,
                                    image_name=f.image_name, labels=f.labels)
        door_vm = door[0] if door is not None else groups[0][0][0]
        # With assign_floating_ip=True a VM's create returns only once its floating IP is attached: never None.
        door_public_ip = cast(pulumi.Output[str], door_vm.public_ip)
        t = bp.tls
        chain, ca_pem, tls_key = tls.endpoint_certificate(
            self, name, own_chain=t.own_chain, own_key=tls_private_key, ca_name=t.ca_name, dns_names=t.dns_names,
            public_ip=door_public_ip, key_setting=t.key_setting, cert_setting=t.cert_setting)
        endpoint = EndpointKeys(api_key_value, chain, ca_pem, tls_key)
        secrets = NodeSecrets(ssh_private_key, hf_token, kernel_cache_credentials)
        fan_out_ips = [vm.private_ip for vms, _ in groups for vm in vms]
        built: list[replicas.Replica] = []
        for args, (vms, host_keys) in zip(bp.replicas, groups, strict=True):
            # Rolling (replicas >= 2): a replica launches once the one before it serves.
            built.append(replicas.build_replica(
                self, args, vms=vms, host_keys=host_keys, secrets=secrets,
                endpoint=None if door is not None else endpoint,
                front_private_ip=door_vm.private_ip if door is not None else None, peer_token=peer_token,
                after=[built[-1].ready] if built and built[-1].ready is not None else [], fan_out_ips=fan_out_ips))

        if door is not None and bp.front is not None:
            the_front = front.Front(
                f"{name}-front", args=bp.front, vm=door[0], host_key=door[1], ssh_private_key=ssh_private_key,
                endpoint=endpoint, head_private_ips=[g.head_private_ip for g in built],
                wait_for=[g.ready for g in built if g.ready is not None], opts=child)
            ready, door_key = the_front.ready, door[1]
            door_proxy: pulumi.Resource | None = the_front.proxy
        else:
            assert built[0].endpoint_ready is not None  # one replica: its head holds the endpoint
            ready, door_proxy, door_key = built[0].endpoint_ready, built[0].nodes[0].proxy, built[0].host_keys[0]
        if bp.caretaker is not None and caretaker_api_key is not None and door_proxy is not None:
            # Once the endpoint is ready (a rolling bring-up of replicas is no idleness); named after every GPU VM, it
            # arms again after an up that re-created one. (The 503 of a stop on the front goes before the readiness
            # wait: the running caretaker takes it away when it sees the GPU VMs back.)
            care = bp.caretaker
            ids = pulumi.Output.all(*[vm.vm_id for g in built for vm in g.vms]).apply(
                # A number may come back from the state as a float (1000.0): the id is its whole part.
                lambda a: " ".join(str(int(i)) if isinstance(i, float) else str(i) for i in a))
            caretaker.caretaker_step(
                self, name, render=ids.apply(lambda i: care.render(NodeSpot(identity=i))),
                deadline_s=care.clock.deadline_s, timeout=care.clock.timeout, public_ip=door_public_ip,
                ssh_user=care.ssh_user, ssh_private_key=ssh_private_key, host_key=door_key,
                api_key=caretaker_api_key, vm_id=door_vm.vm_id, depends_on=[door_proxy, ready.command])

        # The stack outputs: a contract, added to and never renamed. The endpoint is derived from the readiness
        # result, so a failed wait never exports an endpoint as if it served; clients dial apiHostname when it is set
        # (its DNS record, pointed at the endpoint's VM, is the user's), else that VM's address.
        o = bp.outputs
        endpoint_url = pulumi.Output.all(ready.stdout, door_public_ip).apply(
            lambda a: f"https://{o.api_hostname or a[1]}:{o.api_port}")
        vms = [vm for g in built for vm in g.vms]  # every GPU node, the head first
        self.outputs = {
            "endpoint_url": endpoint_url,
            "openai_base_url": endpoint_url.apply(lambda u: f"{u}/v1"),
            "anthropic_base_url": endpoint_url,
            **o.fixed,
            "api_key": api_key_value,
            "ca_certificate": ca_pem,
            "ca_certificate_sha256": pulumi.Output.from_input(ca_pem).apply(tls.fingerprint),
            "head_public_ip": vms[0].public_ip,
            "node_public_ips": pulumi.Output.all(*[vm.public_ip for vm in vms]),
            "node_private_ips": pulumi.Output.all(*[vm.private_ip for vm in vms]),
            "environment_name": env.name,
            "region": placement.region,
            "client_configs": pulumi.Output.all(endpoint_url, ca_pem).apply(
                lambda a: o.client_configs(a[0], ca_certificate=a[1])),
            # The release that made or last upgraded this stack (components/release.py): plan and status compare it.
            VERSION_OUTPUT: __version__,
        }
        if door is not None:
            self.outputs.update({
                **o.front_fixed,
                "front_public_ip": door_public_ip,
                "front_private_ip": door_vm.private_ip,
                "replica_head_private_ips": pulumi.Output.all(*[g.head_private_ip for g in built]),
            })
        self.register_outputs(self.outputs)
