"""InferenceCluster: the whole deployment as one component, from environment to a ready endpoint.

Environment and keypair, every replica's VMs (one replica: the plain stack), least-privilege rules, the per-node
bring-up chains, the endpoint's TLS certificate and proxy (on replica 0's head, or on the front when replicas >= 2),
the readiness wait through it, and the outputs other teams consume. It gets the blueprint (kimi_cluster/blueprint/:
the settings read once, the node steps compiled) and never the settings; this is the graph only: behaviour lives in
the providers and templates.
"""

from __future__ import annotations

from typing import Any, cast

import pulumi

from kimi_cluster.blueprint.stack import Blueprint
from kimi_cluster.deploy import front, replicas, tls
from kimi_cluster.deploy.chain import Chain, StepGroup
from kimi_cluster.deploy.generated_secret import GeneratedSecret
from kimi_cluster.deploy.hyperstack_providers.placement import Placement
from kimi_cluster.deploy.hyperstack_providers.resources import Environment, VirtualMachine
from kimi_cluster.deploy.node_chain import GPU_NODE_TYPE, EndpointKeys
from kimi_cluster.deploy.remote_step import node_connection
from kimi_cluster.deploy.vm import vm_place, vm_with_host_key
from kimi_cluster.plan.steps.model import FRONT, CompiledSteps, VmPlan, VmSpot
from kimi_cluster.plan.steps.scripts import render_vm_scripts
from kimi_cluster.plan.steps.table import BY_NAME
from kimi_cluster.release import VERSION_OUTPUT, __version__


class InferenceCluster(pulumi.ComponentResource):
    """Creates everything `pulumi up` bills for; `pulumi destroy` removes it in reverse, leaving nothing."""

    outputs: dict[str, Any]

    def __init__(
        self,
        name: str,
        bp: Blueprint,
        ssh_private_key: pulumi.Output[str],
        hf_token: pulumi.Output[str] | None,
        kernel_cache_credentials: pulumi.Output[str] | None = None,
        tls_private_key: pulumi.Output[str] | None = None,
        opts: pulumi.ResourceOptions | None = None,
        caretaker_api_key: pulumi.Output[str] | None = None,
    ) -> None:
        super().__init__("kimi:cluster:InferenceCluster", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)

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
        fan_out_ips = [vm.private_ip for vms, _ in groups for vm in vms]
        built = [replicas.replica_rules(self, args, vms=vms, host_keys=host_keys, fan_out_ips=fan_out_ips,
                                        front_private_ip=door_vm.private_ip if door is not None else None)
                 for args, (vms, host_keys) in zip(bp.replicas, groups, strict=True)]

        # Each VM's own component (a GPU node's chain, the front) and what its first step waits on: its rules.
        homes: dict[str, pulumi.ComponentResource] = {}
        made: dict[str, list[pulumi.Resource]] = {}
        vm_at: dict[str, tuple[VirtualMachine, pulumi.Input[str]]] = {}
        for args, group in zip(bp.replicas, built, strict=True):
            for rank, vm in enumerate(group.vms):
                res = args.vms[rank].resource_name
                # SSH must be allowed in before the first command dials.
                homes[res] = StepGroup(GPU_NODE_TYPE, res, pulumi.ResourceOptions(parent=self,
                                                                                    depends_on=group.rules[rank]))
                made[f"{res}/rules"] = list(group.rules[rank])
                vm_at[res] = (vm, group.host_keys[rank])
        if door is not None and bp.front_vm is not None:
            res = bp.front_vm.resource_name
            homes[res], front_rules = front.front_group(self, res, vm=door[0], rules=bp.front_rules)
            made[f"{res}/rules"] = list(front_rules)
            vm_at[res] = door

        # Where each VM stands once its addresses are known; the scripts are rendered from that alone.
        public_tls = endpoint.public_tls()
        head_ips = [g.head_private_ip for g in built]
        gpu_vm_ids = _vm_ids([vm for g in built for vm in g.vms])
        # Each replica's own VMs: a new one among them (a lost node re-created) runs its group's steps again.
        group_ids = [_vm_ids(g.vms) for g in built]
        sharing = bp.fan_out > 1 and peer_token is not None
        peers = pulumi.Output.all(*fan_out_ips).apply(lambda a: list(a) if sharing else None)
        scripts: dict[str, pulumi.Output[str]] = {}
        for plan in bp.vm_plans:
            vm = vm_at[plan.resource][0]
            if plan.kind == FRONT:
                known = {"private_ip": vm.private_ip, "public_ip": vm.public_ip, "tls": public_tls,
                         "gpu_vm_ids": gpu_vm_ids, "front_upstreams": pulumi.Output.all(*head_ips).apply(list)}
            else:
                known = {"private_ip": vm.private_ip, "head_private_ip": built[plan.replica].head_private_ip,
                         "public_ip": vm.public_ip, "peer_ips": peers, "group_vm_ids": group_ids[plan.replica]}
                if door is None and plan.replica == 0 and plan.rank == 0:  # it holds the endpoint
                    known.update(tls=public_tls, gpu_vm_ids=gpu_vm_ids)
            for step in plan.steps:
                scripts[step.resource] = self._script(bp.steps, plan, step.step, known)
        steps = Chain(self, groups=homes, made=made)
        steps.build(
            bp.vm_plans, scripts=scripts, vm_ids={r: vm.vm_id for r, (vm, _) in vm_at.items()},
            connections={r: node_connection(cast(pulumi.Output[str], vm.public_ip), bp.ssh_user, ssh_private_key,
                                            key) for r, (vm, key) in vm_at.items()},
            secrets={"hf_token": hf_token, "peer_token": peer_token, "kernel_cache_credentials":
                     kernel_cache_credentials, "api_key": api_key_value, "tls_private_key": tls_key,
                     "caretaker_api_key": caretaker_api_key})
        steps.register_outputs()
        ready = steps.commands[next(s.resource for p in bp.vm_plans for s in p.steps if s.step == "readiness")]

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
            # The release that made or last upgraded this stack (kimi_cluster/release.py): plan and status compare it.
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

    @staticmethod
    def _script(steps: CompiledSteps, plan: VmPlan, step: str, known: dict[str, Any]) -> pulumi.Output[str]:
        """One step's script, once what it reads of its VM's spot is known (and waiting on nothing else)."""
        reads = [f for f in BY_NAME[step].reads if f in known]
        return pulumi.Output.all(*[known[f] for f in reads]).apply(lambda a: render_vm_scripts(
            steps, plan, VmSpot(**dict(zip(reads, a, strict=True))), only=(step,))[step])


def _vm_ids(vms: list[VirtualMachine]) -> pulumi.Output[str]:
    """The VMs' ids in order, space-separated."""
    return pulumi.Output.all(*[vm.vm_id for vm in vms]).apply(
        # A number may come back from the state as a float (1000.0): the id is its whole part.
        lambda a: " ".join(str(int(i)) if isinstance(i, float) else str(i) for i in a))
