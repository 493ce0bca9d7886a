"""The fake nodes' bridge keeps one MAC while VMs come and go, as a cloud's gateway does.

A Linux bridge with no MAC of its own takes the lowest of its ports' and changes it when that port leaves. A
reclaimed replica's port did, under the replicas' flow: the front kept sending its answers to the bridge's old MAC
(its neighbour entry for the host kept fresh by the host's own packets) and every client of the front hung for a
minute while the replica's twin went on serving the front.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from kimi_cluster.fakes.node_fabric import Fabric, allocate, missing

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(bool(missing()), reason="the fake nodes' network needs root and ip/nft")]


def _mac(device: str, namespace: str | None = None) -> str:
    where = ["-n", namespace] if namespace else []
    out = subprocess.run(["ip", *where, "-j", "link", "show", "dev", device], check=True, capture_output=True,
                         text=True).stdout
    return json.loads(out)[0]["address"]


def test_the_bridge_keeps_its_mac_when_the_port_with_the_lowest_one_goes(tmp_path):
    config = allocate(tmp_path / "nodes")
    fabric = Fabric(config)
    try:
        addresses = [str(config.network.network_address + n) for n in (2, 3, 4)]
        namespaces = {address: fabric.attach(address) for address in addresses}
        before = _mac(config.bridge)
        assert before == config.bridge_mac
        # The port whose MAC is lowest: the one a bridge without a MAC of its own takes, and changes when it goes.
        ports = {address: _mac(config.port(address)) for address in addresses}
        lowest = min(ports, key=lambda a: ports[a])
        fabric.end_namespace(namespaces[lowest])
        assert _mac(config.bridge) == before, f"the bridge's MAC changed when {lowest}'s port went"
        fabric.attach(str(config.network.network_address + 5))  # and when a port joins
        assert _mac(config.bridge) == before
    finally:
        fabric.teardown()


def test_a_vm_re_created_at_an_address_takes_over_a_port_the_kernel_has_not_freed_yet(tmp_path):
    """`ip netns del` only unmounts a namespace: the kernel frees it, and the veth pair in it, later, on a work queue.
    Until then the old port still holds its name, and a VM re-created at the same address must not fail on it."""
    config = allocate(tmp_path / "nodes")
    fabric = Fabric(config)
    address = str(config.network.network_address + 2)
    try:
        # The port as a slow kernel leaves it: still on the host after its namespace went.
        subprocess.run(["ip", "link", "add", config.port(address), "type", "veth", "peer", "name", f"ko{config.id}"],
                       check=True)
        namespace = fabric.attach(address)
        peer = json.loads(subprocess.run(["ip", "-j", "link", "show", "dev", config.port(address)], check=True,
                                         capture_output=True, text=True).stdout)[0]
        assert peer.get("master") == config.bridge and peer.get("link_netnsid") is not None, peer
        assert namespace in fabric.namespaces()
    finally:
        fabric.teardown()
        subprocess.run(["ip", "link", "del", f"ko{config.id}"], capture_output=True)  # if attach failed to take it
