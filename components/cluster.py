"""InferenceCluster: the whole deployment as one component, from environment to a ready endpoint.

Environment and keypair, one VM per rank, least-privilege rules, the per-node bring-up chain, the head's TLS
certificate and proxy, the readiness wait through it, and the outputs other teams consume. The graph only: behaviour
lives in the providers and templates.
"""

from __future__ import annotations

from typing import Any, cast

import pulumi

from components import firewall, front, replicas, tls
from components.client_configs import build_client_configs
from components.generated_secret import GeneratedSecret
from components.hyperstack.placement import Placement
from components.hyperstack.resources import Environment, Keypair, SecurityRule, VirtualMachine
from components.node import GpuNode, KernelCacheSave, Readiness, host_key_user_data
from components.pricing import Quote, catalog_quote
from components.settings import NAMESPACE, Settings


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
    ) -> None:
        super().__init__("kimi:cluster:InferenceCluster", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        quote = quote or catalog_quote(settings)

        # Chosen once from live stock, then kept: everything billable hangs off this region.
        placement = Placement(f"{name}-placement", regions=settings.region_choices,
                              flavor_name=settings.flavor_name, count=settings.nodes * settings.replicas,
                              environment_name=settings.env_name, opts=child,
                              **({"front_flavor_name": settings.front_flavor} if settings.has_front else {}))
        env = Environment(f"{name}-env", name=settings.env_name, region=placement.region, opts=child)
        if settings.keypair_name:
            key_name: pulumi.Input[str] = settings.keypair_name
        else:
            assert settings.ssh_public_key is not None  # Settings requires sshPublicKey when keypairName is unset
            keypair = Keypair(
                f"{name}-keypair",
                name=f"{settings.env_name}-key",
                environment_name=env.name,
                public_key=settings.ssh_public_key,
                opts=child,
            )
            key_name = keypair.name

        # The endpoint never runs unauthenticated: the key is generated once and exported only as a secret; a new
        # apiKeyVersion makes a new one.
        api_key = GeneratedSecret(f"{name}-api-key", version=settings.api_key_version, opts=child)
        # Wrapped explicitly so the key stays secret however the engine treats additional_secret_outputs.
        api_key_value: pulumi.Output[str] = pulumi.Output.secret(api_key.value)
        if settings.has_front:
            self.outputs = self._replicated(name, settings, placement, env, key_name, api_key_value, ssh_private_key,
                                            hf_token, kernel_cache_credentials, tls_private_key, quote)
            self.register_outputs(self.outputs)
            return

        vms: list[VirtualMachine] = []
        host_keys: list[pulumi.Output[str]] = []
        for rank in range(settings.nodes):
            user_data, host_public_key = host_key_user_data(f"{name}-node{rank}", opts=child)
            host_keys.append(host_public_key)
            vms.append(
                VirtualMachine(
                    f"{name}-node{rank}",
                    name=settings.node_name(rank),
                    environment_name=env.name,
                    region=placement.region,
                    flavor_name=settings.flavor_name,
                    image_name=settings.vm_image,
                    key_name=key_name,
                    labels=["kimi-cluster", f"stack-{settings.stack}", "role-head" if rank == 0 else "role-worker",
                            f"rank-{rank}"],
                    user_data=user_data,
                    assign_floating_ip=True,
                    opts=child,
                )
            )

        rules_by_rank = [self._rules(name, settings, rank, vms) for rank in range(settings.nodes)]
        # Nodes serve each other the weight files they fetched from the hub, behind this per-stack token.
        peer_token: pulumi.Output[str] | None = None
        if settings.nodes > 1:
            peer_token = pulumi.Output.secret(GeneratedSecret(f"{name}-peer-token", opts=child).value)
        head_private_ip = vms[0].private_ip
        # With assign_floating_ip=True a VM's create returns only once its floating IP is attached: never None.
        public_ips = [cast(pulumi.Output[str], vm.public_ip) for vm in vms]
        chain, ca_pem, tls_key = self._tls(name, settings, public_ips[0], tls_private_key)

        nodes: list[GpuNode] = []
        for rank, vm in enumerate(vms):
            nodes.append(
                GpuNode(
                    f"{name}-node{rank}",
                    settings=settings,
                    rank=rank,
                    public_ip=public_ips[rank],
                    private_ip=vm.private_ip,
                    head_private_ip=head_private_ip,
                    ssh_private_key=ssh_private_key,
                    hf_token=hf_token,
                    kernel_cache_credentials=kernel_cache_credentials,
                    # Only the head's proxy gets the key; the engines, workers included, run without one.
                    api_key=api_key_value if rank == 0 else None,
                    tls_cert_chain=chain if rank == 0 else None,
                    tls_ca=ca_pem if rank == 0 else None,
                    tls_private_key=tls_key if rank == 0 else None,
                    peer_private_ips=[v.private_ip for v in vms],
                    peer_token=peer_token,
                    host_key=host_keys[rank],
                    # A replaced VM re-runs its whole chain even if it comes back on the same address.
                    vm_id=vm.vm_id,
                    # The guide starts rank 0 first; the others join its rendezvous on port 20000.
                    launch_after=[nodes[0].launched] if rank > 0 else [],
                    # kimi-cluster:nodeTiming (the settle waits, polls, retries), else Timing()'s defaults.
                    timing=settings.timing,
                    # SSH must be allowed in before the first command dials.
                    opts=pulumi.ResourceOptions(parent=self, depends_on=rules_by_rank[rank]),
                )
            )

        # The head answers only once every rank has joined the rendezvous, so wait on all launches and the proxy.
        head_proxy = [nodes[0].proxy] if nodes[0].proxy is not None else []
        ready = Readiness(
            f"{name}-ready",
            settings=settings,
            public_ip=public_ips[0],
            ssh_private_key=ssh_private_key,
            api_key=api_key_value,
            tls_cert_chain=chain,
            tls_ca=ca_pem,
            host_key=host_keys[0],
            timing=settings.timing,
            opts=pulumi.ResourceOptions(parent=self, depends_on=[*(n.launched for n in nodes), *head_proxy]),
        )

        if settings.kernel_cache is not None and kernel_cache_credentials is not None:
            # After the readiness wait, on the head only: the ranks of one TP/EP group compile the same kernels.
            # Nothing below depends on it, so the endpoint never waits for the save and a failed save fails nothing.
            KernelCacheSave(
                f"{name}-kernel-cache",
                settings=settings,
                public_ip=public_ips[0],
                ssh_private_key=ssh_private_key,
                credentials=kernel_cache_credentials,
                host_key=host_keys[0],
                timing=settings.timing,
                opts=pulumi.ResourceOptions(parent=self, depends_on=[ready.command]),
            )

        # Derived from the readiness result, so a failed wait never exports an endpoint as if it served.
        # Clients dial apiHostname when it is set (its DNS record is the user's); else the head's address.
        endpoint_url = pulumi.Output.all(ready.stdout, vms[0].public_ip).apply(
            lambda args: f"https://{settings.api_hostname or args[1]}:{settings.api_port}"
        )
        self.outputs = self._outputs(settings, endpoint_url, api_key_value, ca_pem, vms, env, placement, quote)
        self.register_outputs(self.outputs)

    def _outputs(self, settings: Settings, endpoint_url: pulumi.Output[str], api_key_value: pulumi.Output[str],
                 ca_pem: pulumi.Input[str], vms: list[VirtualMachine], env: Environment, placement: Placement,
                 quote: Quote) -> dict[str, Any]:
        """The stack outputs (a contract: added to, never renamed); `vms` are every GPU node, the head first."""
        return {
            "endpoint_url": endpoint_url,
            "openai_base_url": endpoint_url.apply(lambda u: f"{u}/v1"),
            "anthropic_base_url": endpoint_url,
            "served_model_name": settings.served_name,
            "model": settings.model,
            "model_revision": settings.model_revision,
            "api_key": api_key_value,
            "api_key_version": settings.api_key_version,
            "ca_certificate": ca_pem,
            "ca_certificate_sha256": pulumi.Output.from_input(ca_pem).apply(tls.fingerprint),
            "api_allowed_cidrs": settings.api_cidrs,
            "head_public_ip": vms[0].public_ip,
            "node_public_ips": pulumi.Output.all(*[vm.public_ip for vm in vms]),
            "node_private_ips": pulumi.Output.all(*[vm.private_ip for vm in vms]),
            "node_names": [settings.replica_node_name(r // settings.nodes, r % settings.nodes)
                           for r in range(settings.nodes * settings.replicas)],
            "environment_name": env.name,
            "region": placement.region,
            "topology": settings.topology,
            "engine": settings.engine_name,
            "flavor": settings.flavor_name,
            "gpu_count": settings.all_gpus,
            "hourly_cost_usd": quote.usd_per_hour,
            # Where that figure comes from (pricebook and when, or the catalog and its date), and the catalog's.
            "hourly_cost_source": quote.summary(),
            "hourly_cost_catalog_usd": quote.catalog_usd_per_hour,
            "client_configs": pulumi.Output.all(endpoint_url, ca_pem).apply(
                lambda a: build_client_configs(
                    a[0], settings.served_name, settings.client_context_window, engine=settings.engine_name,
                    ca_certificate=a[1],
                )
            ),
        }

    def _replicated(self, name: str, settings: Settings, placement: Placement, env: Environment,
                    key_name: pulumi.Input[str], api_key_value: pulumi.Output[str],
                    ssh_private_key: pulumi.Output[str], hf_token: pulumi.Output[str] | None,
                    kernel_cache_credentials: pulumi.Output[str] | None, tls_private_key: pulumi.Output[str] | None,
                    quote: Quote) -> dict[str, Any]:
        """replicas >= 2: every replica's engine group, and the front that holds the endpoint (components/front.py).

        The API key and the TLS key go to the front alone; each replica's head engine listens on its private address,
        open to the front's /32 only.
        """
        child = pulumi.ResourceOptions(parent=self)
        where = {"environment_name": env.name, "region": placement.region, "key_name": key_name}
        groups = [replicas.replica_vms(self, name, settings, r, **where) for r in range(settings.replicas)]
        fvm, front_host_key = front.front_vm(self, f"{name}-front", settings, **where)
        front_public_ip = cast(pulumi.Output[str], fvm.public_ip)
        chain, ca_pem, tls_key = self._tls(name, settings, front_public_ip, tls_private_key)
        # One token for the whole fan-out: its peers are every GPU node of every replica.
        peer_token: pulumi.Output[str] = pulumi.Output.secret(GeneratedSecret(f"{name}-peer-token", opts=child).value)
        fan_out_ips = [vm.private_ip for vms, _ in groups for vm in vms]
        built: list[replicas.Replica] = []
        for r, (vms, host_keys) in enumerate(groups):
            built.append(replicas.build_replica(
                self, name, settings, r, vms=vms, host_keys=host_keys, front_private_ip=fvm.private_ip,
                ssh_private_key=ssh_private_key, hf_token=hf_token, kernel_cache_credentials=kernel_cache_credentials,
                peer_token=peer_token, after=[built[-1].ready] if built else [], fan_out_ips=fan_out_ips,
                timing=settings.timing))
        the_front = front.Front(
            f"{name}-front", settings=settings, vm=fvm, host_key=front_host_key, ssh_private_key=ssh_private_key,
            api_key=api_key_value, tls_cert_chain=chain, tls_ca=ca_pem, tls_private_key=tls_key,
            head_private_ips=[g.head_private_ip for g in built], wait_for=[g.ready for g in built],
            timing=settings.timing, opts=child)
        if settings.kernel_cache is not None and kernel_cache_credentials is not None:
            # Replica 0's head, once it serves: every replica compiles the same kernels for the same key.
            KernelCacheSave(f"{name}-kernel-cache", settings=settings, public_ip=built[0].public_ips[0],
                            ssh_private_key=ssh_private_key, credentials=kernel_cache_credentials,
                            host_key=built[0].host_keys[0], timing=settings.timing,
                            opts=pulumi.ResourceOptions(parent=self, depends_on=[built[0].ready]))
        # As on one replica: clients dial apiHostname when it is set (its DNS record, pointed at the front, is the
        # user's); else the front's address.
        endpoint_url = pulumi.Output.all(the_front.ready.stdout, front_public_ip).apply(
            lambda args: f"https://{settings.api_hostname or args[1]}:{settings.api_port}")
        all_vms = [vm for g in built for vm in g.vms]
        outputs = self._outputs(settings, endpoint_url, api_key_value, ca_pem, all_vms, env, placement, quote)
        outputs.update({
            "replicas": settings.replicas,
            "front_public_ip": front_public_ip,
            "front_private_ip": fvm.private_ip,
            "front_flavor": settings.front_flavor,
            "replica_node_names": [[settings.replica_node_name(r, n) for n in range(settings.nodes)]
                                   for r in range(settings.replicas)],
            "replica_head_private_ips": pulumi.Output.all(*[g.head_private_ip for g in built]),
        })
        return outputs

    def _tls(self, name: str, settings: Settings, head_public_ip: pulumi.Output[str], own_key: pulumi.Output[str] | None
             ) -> tuple[pulumi.Input[str], pulumi.Input[str], pulumi.Output[str]]:
        """(server certificate chain, CA certificate clients trust, server private key as a secret).

        Your own certificate (tlsCertificate + tlsPrivateKey) is used as given, its last certificate being the CA;
        otherwise the stack's own CA signs a certificate for the head's public address.
        """
        child = pulumi.ResourceOptions(parent=self)
        if settings.tls_certificate is not None:
            if own_key is None:
                raise ValueError(f"{NAMESPACE}:tlsPrivateKey is required with {NAMESPACE}:tlsCertificate; set it with: "
                                 f"pulumi config set --secret {NAMESPACE}:tlsPrivateKey < server.key")
            blocks = tls.split_chain(settings.tls_certificate)

            def checked(key: str) -> str:
                try:
                    tls.check_key_matches(blocks[0], key)
                except ValueError as exc:
                    raise ValueError(f"{NAMESPACE}:tlsPrivateKey: {exc} ({NAMESPACE}:tlsCertificate)") from None
                return key

            return "".join(blocks), blocks[-1], pulumi.Output.secret(own_key.apply(checked))
        dns_names = [settings.api_hostname] if settings.api_hostname else []
        ca = tls.CertificateAuthority(f"{name}-ca", common_name=f"kimi-cluster {settings.stack} CA",
                                      permitted_dns_names=dns_names, opts=child)
        cert = tls.ServerCertificate(f"{name}-tls", ca, head_public_ip.apply(lambda ip: [ip]), dns_names, opts=child)
        return cert.cert_pem, ca.cert_pem, pulumi.Output.secret(cert.key_pem)

    def _rules(self, name: str, settings: Settings, rank: int, vms: list[VirtualMachine]) -> list[SecurityRule]:
        """One resource per rule: a new operatorCidr or apiAllowedCidrs replaces these rules and never the VM."""
        return [
            SecurityRule(
                f"{name}-node{rank}-{spec.key}",
                vm_id=vms[rank].vm_id,
                direction="ingress",
                protocol=spec.protocol,
                ethertype=spec.ethertype,
                remote_ip_prefix=spec.remote_ip_prefix,
                port_range_min=spec.port_range_min,
                port_range_max=spec.port_range_max,
                opts=pulumi.ResourceOptions(parent=self),
            )
            for spec in firewall.node_rules(settings, rank, [vm.private_ip for vm in vms])
        ]
