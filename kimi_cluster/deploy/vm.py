"""A node's VM with its own SSH host key: the key made once, installed by cloud-init, pinned in every connection.

The module keeps its name for the pickled provider below: live stacks recorded `kimi_cluster.deploy.vm._HostKeyProvider`
in their state, and `pulumi destroy` unpickles it from there (tests/repository/test_pickled_providers.py). Every VM
of the stack (GPU nodes and the front) is made by `vm_with_host_key`, so each one gets its key the same way.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi.dynamic as dyn

from kimi_cluster.deploy.hyperstack_providers.resources import Environment, Keypair, VirtualMachine


@dataclass(frozen=True)
class VmPlace:
    """Where every VM of a stack goes: its environment and region (the placement's choice) and the keypair."""

    environment_name: pulumi.Input[str]
    region: pulumi.Input[str]
    key_name: pulumi.Input[str]


def vm_place(parent: pulumi.Resource, name: str, env: Environment, region: pulumi.Input[str], *, env_name: str,
             keypair_name: str | None, ssh_public_key: str | None) -> VmPlace:
    """Where the stack's VMs go: the environment, its region, and the keypair they get (keypairName, else one made
    here from sshPublicKey, as `<name>-keypair`)."""
    if keypair_name:
        return VmPlace(env.name, region, keypair_name)
    assert ssh_public_key is not None  # Settings requires sshPublicKey when keypairName is unset
    keypair = Keypair(f"{name}-keypair", name=f"{env_name}-key", environment_name=env.name,
                      public_key=ssh_public_key, opts=pulumi.ResourceOptions(parent=parent))
    return VmPlace(env.name, region, keypair.name)


def vm_with_host_key(parent: pulumi.Resource, resource_name: str, place: VmPlace, *, name: str, flavor_name: str,
                     image_name: str, labels: list[str]) -> tuple[VirtualMachine, pulumi.Output[str]]:
    """A VM with a floating IP and its own host key (made first, as `<resource_name>-host-key`); returns the VM and
    the public host key to pin in every SSH connection to it."""
    child = pulumi.ResourceOptions(parent=parent)
    user_data, host_key = host_key_user_data(resource_name, opts=child)
    vm = VirtualMachine(resource_name, name=name, environment_name=place.environment_name, region=place.region,
                        flavor_name=flavor_name, image_name=image_name, key_name=place.key_name, labels=labels,
                        user_data=user_data, assign_floating_ip=True, opts=child)
    return vm, host_key


# Stable names: state records this provider as `kimi_cluster.deploy.vm._HostKeyProvider` (pickled by reference) and
# `destroy` of an existing stack unpickles it from there. Never rename or move it.
class _HostKeyProvider(dyn.ResourceProvider):
    """Makes one ed25519 host key at create time; stateless, and everything it needs is imported inside."""

    # Not a secret (see kimi_cluster.deploy.hyperstack_providers.providers.HyperstackProvider): stateless, pickled
    # by reference, and its diff never reads `__provider`.
    serialize_as_secret_always = False


    def create(self, props: dict[str, Any]) -> dyn.CreateResult:
        import os
        import shutil
        import subprocess
        import tempfile

        if shutil.which("ssh-keygen") is None:
            raise RuntimeError("ssh-keygen (OpenSSH) is needed on this machine to make the nodes' SSH host keys")
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "host_key")
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "kimi-cluster-node", "-f", path],
                           check=True, capture_output=True)
            with open(path, encoding="utf-8") as fh:
                private = fh.read()
            with open(path + ".pub", encoding="utf-8") as fh:
                public = " ".join(fh.read().split()[:2])
        fingerprint = hashlib.sha256(public.encode()).hexdigest()[:16]
        return dyn.CreateResult(id_=f"hostkey-{fingerprint}", outs={"private_key": private, "public_key": public})

    def diff(self, _id: str, _olds: dict[str, Any], _news: dict[str, Any]) -> dyn.DiffResult:
        # The key must outlive every run: a new one would replace the VM that carries it in user_data.
        return dyn.DiffResult(changes=False)


class NodeHostKey(dyn.Resource, module="kimi", name="NodeHostKey"):
    """An ed25519 SSH host key pair; `private_key` is a secret output and never a plain input anywhere."""

    private_key: pulumi.Output[str]
    public_key: pulumi.Output[str]

    def __init__(self, name: str, opts: pulumi.ResourceOptions | None = None) -> None:
        opts = pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(additional_secret_outputs=["private_key"]))
        super().__init__(_HostKeyProvider(), name, {"private_key": None, "public_key": None}, opts)


def host_key_cloud_config(private_key: str, public_key: str) -> str:
    """cloud-init user_data installing this host key as the VM's only one, so the pinned key is the one offered.

    `ssh_deletekeys` removes the image's host keys; with `ssh_keys` given, cloud-init's cc_ssh writes only that
    pair and never reads `ssh_genkeytypes` (which must not be `[]` anyway: its schema has minItems 1, and an
    invalid user_data leaves `cloud-init status` at "degraded"). tests/node/test_user_data.py runs cloud-init's
    own validator on what the program produces for every node.
    """
    indented = "\n".join("    " + line for line in private_key.strip().splitlines())
    return (
        "#cloud-config\n"
        "ssh_deletekeys: true\n"
        "ssh_keys:\n"
        "  ed25519_private: |\n"
        f"{indented}\n"
        f"  ed25519_public: {public_key.strip()}\n"
    )


def host_key_user_data(name: str, opts: pulumi.ResourceOptions | None = None
                       ) -> tuple[pulumi.Output[str], pulumi.Output[str]]:
    """(user_data for the VM, a secret; the public host key to pin in every SSH connection to it)."""
    key = NodeHostKey(f"{name}-host-key", opts)
    user_data = pulumi.Output.all(key.private_key, key.public_key).apply(
        lambda kv: host_key_cloud_config(kv[0], kv[1]) if kv[0] and kv[1] else ""
    )
    return pulumi.Output.secret(user_data), key.public_key
