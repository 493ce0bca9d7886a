"""What a GPU node's chain and the endpoint's VM read: the endpoint's keys, and every node's secrets.

ready -> storage -> (image pull [-> kernel warm-up] || weights || kernel-cache restore) -> check -> launch, each a
remote step (kimi_cluster/deploy/remote_step.py) running a script the step table renders
(kimi_cluster/plan/steps/); the head of a one-replica stack also runs the authenticating TLS proxy (after its image
pull, beside the download). Secrets reach the node only on stdin, and only the node holding the endpoint gets the
API key: the engines run without one, behind the proxy.

What re-runs what: pulumi-command replaces a command only when its `triggers` change (none are set); any other
changed input is an update, and an update re-runs `create`. That is its text or stdin, and also its `connection`: a
rotated SSH key, a new sshUser or a new address re-runs every step of the chain. So each step is idempotent and
cheap on a healthy node: storage changes nothing, the pull finds the image, the download finds every file, the
launch leaves an engine with the same configuration running (same container, same process). A new image or engine
flag changes the pull and the launch; a new revision changes weights, check and launch; a new API key changes only
the proxy step (and the readiness wait); nothing here replaces a VM.
"""

from __future__ import annotations

from dataclasses import dataclass

import pulumi

from kimi_cluster.plan.steps.model import GPU_NODE_TYPE, KERNEL_CACHE_SAVE_TYPE, READINESS_TYPE, ProxyTls

__all__ = ["GPU_NODE_TYPE", "KERNEL_CACHE_SAVE_TYPE", "READINESS_TYPE", "EndpointKeys", "NodeSecrets"]


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


@dataclass(frozen=True)
class NodeSecrets:
    """What every GPU node's chain may read on stdin or dial with: the SSH key, the hub token, the kernel-cache
    store's credentials (the last two optional)."""

    ssh_private_key: pulumi.Output[str]
    hf_token: pulumi.Output[str] | None = None
    kernel_cache_credentials: pulumi.Output[str] | None = None
