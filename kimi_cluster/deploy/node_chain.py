"""The bring-up components: one GPU node's chain of remote steps, the endpoint's readiness wait, the kernel-cache save.

ready -> storage -> (image pull [-> kernel warm-up] || weights || kernel-cache restore) -> check -> launch, each a
remote step (kimi_cluster/deploy/remote_step.py) running a script rendered by kimi_cluster/plan/step_scripts.py; the
head of a
one-replica stack also runs the authenticating TLS proxy (after its image pull, beside the download). Secrets reach
the node only on stdin, and only the node holding the endpoint gets the API key: the engines run without one, behind
the proxy.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pulumi
from pulumi_command import remote

from kimi_cluster.deploy.remote_step import node_connection, proxy_stdin, remote_command_text, remote_step, stdin_lines
from kimi_cluster.plan.blueprint import ChainArgs, WaitArgs
from kimi_cluster.plan.step_scripts import PLAN_TLS, NodeSpot, ProxyTls

GPU_NODE_TYPE = "kimi:cluster:GpuNode"
READINESS_TYPE = "kimi:cluster:Readiness"
KERNEL_CACHE_SAVE_TYPE = "kimi:cluster:KernelCacheSave"


@dataclass(frozen=True)
class EndpointKeys:
    """What the VM holding the endpoint gets (the head of one replica, else the front): the API key, the TLS
    certificate chain and the CA clients trust, and the TLS private key. The two keys are secrets."""

    api_key: pulumi.Output[str]
    cert_chain: pulumi.Input[str]
    ca: pulumi.Input[str]
    private_key: pulumi.Output[str]

    def public_tls(self) -> pulumi.Output[ProxyTls]:
        return pulumi.Output.all(self.cert_chain, self.ca).apply(lambda t: ProxyTls(t[0], t[1]))

    def proxy_stdin(self) -> pulumi.Output[str]:
        """The proxy step's stdin: the API key, then the TLS private key."""
        return proxy_stdin(self.api_key, self.private_key)


@dataclass(frozen=True)
class NodeSecrets:
    """What every GPU node's chain may read on stdin or dial with: the SSH key, the hub token, the kernel-cache
    store's credentials (the last two optional)."""

    ssh_private_key: pulumi.Output[str]
    hf_token: pulumi.Output[str] | None = None
    kernel_cache_credentials: pulumi.Output[str] | None = None


class GpuNode(pulumi.ComponentResource):
    """The bring-up chain of one node. `launched` is the launch command, for whatever must come after it; on the head
    `proxy` is the proxy step.

    What re-runs what: pulumi-command replaces a command only when its `triggers` change (none are set here); any
    other changed input is an update, and an update re-runs `create`. That is its text or stdin, and also its
    `connection`: a rotated SSH key, a new sshUser or a new address re-runs every step of the chain. So each step is
    idempotent and cheap on a healthy node: storage changes nothing, the pull finds the image, the download finds
    every file, the launch leaves an engine with the same configuration running (same container, same process).
    A new image or engine flag changes the pull and the launch; a new revision changes weights, check and launch;
    a new API key changes only the proxy step (and the readiness wait); nothing here replaces a VM.
    """

    launched: remote.Command
    proxy: remote.Command | None
    commands: dict[str, remote.Command]

    def __init__(
        self,
        name: str,
        *,
        args: ChainArgs,
        public_ip: pulumi.Input[str],
        private_ip: pulumi.Input[str],
        head_private_ip: pulumi.Input[str],
        secrets: NodeSecrets,
        endpoint: EndpointKeys | None = None,
        peer_private_ips: Sequence[pulumi.Input[str]] = (),
        peer_token: pulumi.Input[str] | None = None,
        host_key: pulumi.Input[str] | None = None,
        ssh_port: pulumi.Input[int] = 22,
        vm_id: pulumi.Input[str | int] | None = None,
        launch_after: Sequence[pulumi.Resource] = (),
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__(GPU_NODE_TYPE, name, None, opts)
        if args.serves_api and endpoint is None:
            raise ValueError("the head (rank 0) runs the proxy: it needs the API key and the TLS certificate and key")
        if not args.serves_api and endpoint is not None:
            raise ValueError("only the head gets the API key, and no replica behind a front; workers serve no HTTP")
        self._name = name
        self._clocks = args.clocks
        self._vm_id = pulumi.Output.from_input(vm_id)
        self._connection = node_connection(public_ip, args.ssh_user, secrets.ssh_private_key, host_key, ssh_port)
        public_tls = endpoint.public_tls() if endpoint is not None else PLAN_TLS
        sharing = args.fan_out > 1 and len(peer_private_ips) == args.fan_out and peer_token is not None
        scripts = pulumi.Output.all(private_ip, head_private_ip, public_ip, public_tls, *peer_private_ips).apply(
            lambda a: args.render(NodeSpot(args.rank, a[0], a[1], a[3], a[2], a[4:] if sharing else None,
                                           args.peer_rank)))
        hf_token = secrets.hf_token
        token = stdin_lines(hf_token) if hf_token is not None else None
        # The weights step reads the hub token, then (when the nodes share the download) the peer token.
        weights_stdin = stdin_lines(hf_token, peer_token) if sharing else token
        # Children do not inherit the component's depends_on (e.g. the firewall rule that lets SSH in).
        caller_deps = opts.depends_on if opts is not None else None

        ready = self._step("ready", scripts, caller_deps)
        storage = self._step("storage", scripts, [ready])
        # The pull and the download both need the storage disk, not each other: they run side by side.
        image = self._step("image", scripts, [storage])
        weights = self._step("weights", scripts, [storage], stdin=weights_stdin)
        check = self._step("check", scripts, [weights], stdin=token)
        before_launch: list[pulumi.Resource] = [check, image]
        self.commands = {"ready": ready, "storage": storage, "image": image, "weights": weights, "check": check}
        restored: list[pulumi.Resource] = []
        if args.kernel_cache:
            # Alongside the pull and the download; it never fails, so the launch only ever waits for it.
            restore = self._step("cache-restore", scripts, [storage],
                                 stdin=stdin_lines(secrets.kernel_cache_credentials))
            restored.append(restore)
            self.commands["cache-restore"] = restore
        before_launch += restored
        if args.warmup:
            # Beside the download once the image is in, after any restore (whose kernels it then finds); it never
            # fails (a WARNING, and the launch starts cold), so the launch only ever waits for it.
            warm = self._step("warmup", scripts, [image, *restored])
            before_launch.append(warm)
            self.commands["warmup"] = warm
        # The engine gets no key: no stdin at all.
        self.launched = self._step("launch", scripts, [*before_launch, *launch_after])
        self.commands["launch"] = self.launched
        self.proxy = None
        if endpoint is not None:
            # The proxy needs only its image: it runs (answering 502 for anything but 401s) while the weights arrive.
            self.proxy = self._step("proxy", scripts, [image], stdin=endpoint.proxy_stdin())
            self.commands["proxy"] = self.proxy
        self.register_outputs({"launched": self.launched.id, "launch_stdout": self.launched.stdout})

    def _step(self, step: str, scripts: pulumi.Output[dict[str, str]], depends_on: Any,
              stdin: pulumi.Output[str] | None = None) -> remote.Command:
        clock = self._clocks[step]
        create = pulumi.Output.all(scripts, self._vm_id).apply(
            lambda a: remote_command_text(step, a[0][step], deadline_s=clock.deadline_s, vm_id=a[1]))
        return remote_step(self, f"{self._name}-{step}", create, self._connection, depends_on, stdin, clock.timeout)


class Readiness(pulumi.ComponentResource):
    """Waits on the endpoint's VM until /v1/models lists the served model, asked through the proxy over TLS with the
    key (the certificate checked against the CA for the public address); on failure prints the engine log and fails.

    Give it the launches to wait for as depends_on. Its text carries a fingerprint of every rank's launch
    configuration (or the given `identity`), so it runs again whenever a relaunch could have changed the answer.
    """

    stdout: pulumi.Output[str]
    command: remote.Command

    def __init__(
        self,
        name: str,
        *,
        args: WaitArgs,
        public_ip: pulumi.Input[str],
        ssh_private_key: pulumi.Input[str],
        endpoint: EndpointKeys,
        host_key: pulumi.Input[str] | None = None,
        ssh_port: pulumi.Input[int] = 22,
        identity: pulumi.Input[str] | None = None,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__(READINESS_TYPE, name, None, opts)
        text = pulumi.Output.all(public_ip, endpoint.public_tls(), identity).apply(lambda a: remote_command_text(
            args.step, args.render(NodeSpot(public_ip=a[0], tls=a[1], identity=a[2], container=args.container)),
            deadline_s=args.clock.deadline_s))
        self.command = remote_step(
            self, f"{name}-wait", text, node_connection(public_ip, args.ssh_user, ssh_private_key, host_key, ssh_port),
            opts.depends_on if opts is not None else None, stdin_lines(endpoint.api_key), args.clock.timeout)
        self.stdout = self.command.stdout
        self.register_outputs({"stdout": self.stdout})


class KernelCacheSave(pulumi.ComponentResource):
    """After the readiness wait, packs the head's compiled kernels into the configured store (kernelCache).

    Nothing reads its output: the endpoint is exported from the readiness wait alone, and the script exits 0 whatever
    happens (a failure is one WARNING line), so a slow or broken store never fails `pulumi up` or the endpoint.
    Its text carries the cache key and the launch identity, so it runs again after a relaunch with a new key.
    """

    command: remote.Command

    def __init__(
        self,
        name: str,
        *,
        args: WaitArgs,
        public_ip: pulumi.Input[str],
        ssh_private_key: pulumi.Input[str],
        credentials: pulumi.Input[str],
        host_key: pulumi.Input[str] | None = None,
        ssh_port: pulumi.Input[int] = 22,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__(KERNEL_CACHE_SAVE_TYPE, name, None, opts)
        self.command = remote_step(
            self, f"{name}-save",
            remote_command_text(args.step, args.render(NodeSpot()), deadline_s=args.clock.deadline_s),
            node_connection(public_ip, args.ssh_user, ssh_private_key, host_key, ssh_port),
            opts.depends_on if opts is not None else None, stdin_lines(credentials), args.clock.timeout)
        self.register_outputs({})
