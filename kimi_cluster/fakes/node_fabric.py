"""Fake GPU nodes on a real network: one network namespace per VM, real OpenSSH in it, nftables for its rules.

The emulator (kimi_cluster/fakes/hyperstack_emulator/) boots a node here when it creates a VM and ends it when the VM
goes:
- a namespace `kn<id>-<n>` whose `eth0` holds the address the emulator handed out, on a bridge `kb<id>` whose
  host side (`.1` of the fabric's /24) is where the operator, the hub and the bucket are;
- the VM's cloud-config applied as cloud-init would: its `ssh_keys` become the node's only host key, the
  keypair's public key the default user's `authorized_keys` (`ubuntu`, as on Hyperstack's Ubuntu images);
- Debian's `sshd` on port 22, logging in as `ubuntu` into the node's directory (its root disk, uid 0 there, like a
  user with passwordless sudo), with the fake node's stubs first on PATH and the fault knobs in the environment;
- the VM's security rules as an nftables input chain, default drop: what the rules do not let in is dropped.

Nothing here routes anywhere but the fabric's own /24: a namespace has no default route, and an `unreachable`
route for the /24 outlives the bridge, so no packet for a fake node ever leaves this machine.

Needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN for `ip netns`), `ip`, `sshd` and `nft`: `... node_fabric check` says
what is missing; `teardown CONFIG` removes a fabric whose owner died.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import ipaddress
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kimi_cluster.fakes.node_cloud_init import apply_cloud_config
from kimi_cluster.fakes.node_firewall import nft_ruleset

# Every fabric's /24 is drawn from here. 10.213/16 is private and is not on this machine's routes unless a fabric
# put it there: allocate() refuses a /24 that any other route covers.
POOL = ipaddress.IPv4Network("10.213.0.0/16")
IMAGE_USER = "ubuntu"
# Inside every node, this name is the machine's own address on the bridge: a second name for the host that serves
# the hub, so the hub's LFS redirects change host (and huggingface_hub drops its token for them, as on the real hub).
CDN_NAME = "cdn.fabric.internal"
SSHD = shutil.which("sshd") or "/usr/sbin/sshd"
_LOCK = Path("/run/lock/kimi-node-fabric.lock")
# One file per fabric this machine holds (its FabricConfig): a fabric whose nodes' directory is gone (a workdir removed
# by hand, a test's temporary directory cleaned) has no one left to tear it down, so the next allocate() does.
_REGISTRY = Path("/run/lock/kimi-node-fabrics")
_NETNS_ETC = Path("/etc/netns")


class FabricError(Exception):
    """A namespace, link, sshd or ruleset could not be set up; the message names the command and its error."""


def _run(*argv: str, stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(list(argv), input=stdin, capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise FabricError(f"{' '.join(argv)} failed ({done.returncode}): {(done.stderr or done.stdout).strip()}")
    return done


def missing() -> list[str]:
    """What this machine lacks for a fabric, as install hints; empty when it can run one."""
    needs = []
    if os.geteuid() != 0:
        needs.append("root (network namespaces need CAP_NET_ADMIN and CAP_SYS_ADMIN): run as root")
    for tool, package in (("ip", "iproute2"), ("nft", "nftables"), ("ssh", "openssh-client")):
        if shutil.which(tool) is None:
            needs.append(f"{tool} (apt-get install {package})")
    if not Path(SSHD).exists():
        needs.append("sshd (apt-get install openssh-server)")
    return needs


@dataclass(frozen=True)
class FabricConfig:
    """What the emulator needs to boot nodes, written by whoever made the fabric (the sandbox) as JSON."""

    id: str
    subnet: str
    nodes_dir: str
    path: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)

    @property
    def network(self) -> ipaddress.IPv4Network:
        return ipaddress.IPv4Network(self.subnet)

    @property
    def host_address(self) -> str:
        """The machine's own address on the bridge: the operator's source address, where the hub listens."""
        return str(self.network.network_address + 1)

    @property
    def first_node_address(self) -> str:
        return str(self.network.network_address + 2)

    @property
    def bridge(self) -> str:
        return f"kb{self.id}"

    @property
    def bridge_mac(self) -> str:
        """The bridge's own MAC, fixed: locally administered (02), then "kb" and the fabric's three id bytes."""
        return ":".join(["02", "6b", "62", self.id[0:2], self.id[2:4], self.id[4:6]])

    def namespace(self, address: str) -> str:
        return f"kn{self.id}-{int(ipaddress.IPv4Address(address)) & 0xFF}"

    def port(self, address: str) -> str:
        """The bridge's end of the link to the namespace at `address` (its other end is the namespace's eth0)."""
        return f"kv{self.id}{int(ipaddress.IPv4Address(address)) & 0xFF}"

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "subnet": self.subnet, "nodes_dir": self.nodes_dir, "path": list(self.path),
                "env": dict(self.env)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> FabricConfig:
        return cls(str(data["id"]), str(data["subnet"]), str(data["nodes_dir"]), tuple(data.get("path") or ()),
                   dict(data.get("env") or {}))

    @classmethod
    def load(cls, path: str | Path) -> FabricConfig:
        """The file `to_json` wrote (a few hundred bytes); ValueError past 1 MB, or for a shape that is not it."""
        with open(path, "rb") as fh:
            text = fh.read(1024 * 1024 + 1)
        if len(text) > 1024 * 1024:
            raise ValueError("larger than 1 MB, far more than any fabric's configuration")
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError("not a JSON object with the fabric's id, subnet and nodes_dir")
        return cls.from_json(data)


@contextlib.contextmanager
def _fabric_lock() -> Iterator[None]:
    _LOCK.parent.mkdir(parents=True, exist_ok=True)
    with open(_LOCK, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def _routes() -> list[ipaddress.IPv4Network]:
    out = json.loads(_run("ip", "-j", "-4", "route", "show", "table", "all").stdout or "[]")
    nets = []
    for route in out:
        dst = route.get("dst")
        if dst and dst != "default":
            with contextlib.suppress(ValueError):
                nets.append(ipaddress.IPv4Network(dst, strict=False))
    return nets


def allocate(nodes_dir: str | Path, path: Sequence[str] = (), env: Mapping[str, str] | None = None) -> FabricConfig:
    """A new fabric on a /24 of POOL that no route of this machine covers, its bridge up and its guard route set."""
    if needs := missing():
        raise FabricError("the fake nodes' network needs " + "; ".join(needs))
    with _fabric_lock():
        _end_orphans()
        taken = _routes()
        for subnet in POOL.subnets(new_prefix=24):
            if any(subnet.overlaps(net) for net in taken) or subnet.network_address.packed[2] == 0:
                continue
            config = FabricConfig(secrets.token_hex(3), str(subnet), str(nodes_dir), tuple(path), dict(env or {}))
            # The nodes' directory exists from now on, before any node boots: an allocate() in another process that
            # finds this fabric registered must not take it for an orphan (_end_orphans) while it is being set up.
            Path(nodes_dir).mkdir(parents=True, exist_ok=True)
            _REGISTRY.mkdir(parents=True, exist_ok=True)
            (_REGISTRY / f"{config.id}.json").write_text(json.dumps(config.to_json()))
            Fabric(config).setup()
            return config
    raise FabricError(f"every /24 of {POOL} is in use on this machine")


def _end_orphans() -> None:
    """Tear down every registered fabric whose nodes' directory no longer exists (under the fabric lock)."""
    for entry in sorted(_REGISTRY.glob("*.json")) if _REGISTRY.is_dir() else []:
        try:
            config = FabricConfig.load(entry)
        except (OSError, ValueError, KeyError, TypeError):
            entry.unlink(missing_ok=True)
            continue
        if not Path(config.nodes_dir).exists():
            Fabric(config).teardown()


class Fabric:
    """The bridge and the nodes of one FabricConfig."""

    def __init__(self, config: FabricConfig) -> None:
        self.config = config

    # -- the bridge --

    def setup(self) -> None:
        c = self.config
        # Packets for the /24 die here if the bridge goes: they never take this machine's default route.
        _run("ip", "route", "add", "unreachable", c.subnet, "metric", "4242")
        # A MAC of its own, set once: a bridge without one takes the lowest of its ports' MACs and changes it when
        # that port goes (a reclaimed VM's) or a lower one joins. The nodes would keep sending to the old MAC, their
        # neighbour entry for the host confirmed by the host's own packets, and every answer to the operator would
        # vanish for a minute. A cloud's gateway keeps its MAC whatever VM comes or goes.
        _run("ip", "link", "add", c.bridge, "address", c.bridge_mac, "type", "bridge")
        _run("ip", "addr", "add", f"{c.host_address}/{c.network.prefixlen}", "dev", c.bridge)
        _run("ip", "link", "set", c.bridge, "up")

    def teardown(self) -> list[str]:
        """Every node, the bridge and the guard route; returns what could not be removed."""
        problems = []
        for namespace in self.namespaces():
            problems += self.end_namespace(namespace)
        _run("ip", "link", "del", self.config.bridge, check=False)
        _run("ip", "route", "del", "unreachable", self.config.subnet, "metric", "4242", check=False)
        if self.config.bridge in _run("ip", "-o", "link", "show").stdout.split():
            problems.append(f"bridge {self.config.bridge} is still there")
        else:
            (_REGISTRY / f"{self.config.id}.json").unlink(missing_ok=True)
        return problems

    def bridge_up(self) -> bool:
        """Whether the bridge still holds the fabric's host address (a reboot or a teardown removes it)."""
        out = _run("ip", "-j", "-4", "addr", "show", "dev", self.config.bridge, check=False).stdout or "[]"
        try:
            links = json.loads(out)
        except ValueError:
            return False
        return any(a.get("local") == self.config.host_address for link in links for a in link.get("addr_info", []))

    def namespaces(self) -> list[str]:
        prefix = f"kn{self.config.id}-"
        out = _run("ip", "netns", "list", check=False).stdout
        return [line.split()[0] for line in out.splitlines() if line.startswith(prefix)]

    # -- a node --

    def node_dir(self, address: str) -> Path:
        return Path(self.config.nodes_dir) / address

    def _sshd_dir(self, address: str) -> Path:
        # Beside the nodes, not in one: a node's scripts must not reach sshd's config or pid file.
        return Path(self.config.nodes_dir).parent / "sshd" / address

    def boot(self, address: str, user_data: str | None, authorized_key: str, rules: Iterable[Mapping[str, Any]]
             ) -> None:
        """Bring a VM's node up at `address`: namespace, link, cloud-config, firewall, then sshd on port 22."""
        c = self.config
        if ipaddress.IPv4Address(address) not in c.network:
            raise FabricError(f"{address} is not in the fabric's {c.subnet}")
        namespace = c.namespace(address)
        if namespace in self.namespaces():
            self.end_namespace(namespace)
        node = self.node_dir(address)
        node.mkdir(parents=True, exist_ok=True)
        self.attach(address)
        self.firewall(address, rules)
        host_key = apply_cloud_config(node, user_data)
        ssh = node / ".ssh"
        ssh.mkdir(mode=0o700, exist_ok=True)
        (ssh / "authorized_keys").write_text(authorized_key.strip() + "\n")
        self._start_sshd(address, namespace, host_key)

    def attach(self, address: str) -> str:
        """A bare namespace at `address` on the bridge (no firewall, no sshd): a VM's network, or a stranger on the
        same network for a test. Returns its name."""
        c = self.config
        namespace = c.namespace(address)
        _run("ip", "netns", "add", namespace)
        veth = c.port(address)
        # A VM deleted here a moment ago may still hold the port: `ip netns del` only unmounts its namespace, which
        # the kernel frees (its veth pair with it) later, on a work queue, later still on a loaded machine.
        _run("ip", "link", "del", veth, check=False)
        _run("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", namespace)
        _run("ip", "link", "set", veth, "master", c.bridge, "up")
        _run("ip", "-n", namespace, "addr", "add", f"{address}/{c.network.prefixlen}", "dev", "eth0")
        _run("ip", "-n", namespace, "link", "set", "eth0", "up")
        _run("ip", "-n", namespace, "link", "set", "lo", "up")
        # The address may have been another interface's a moment ago (a deleted VM's, re-created or taken over by a
        # test's observer). The host and every other namespace on the bridge forget their neighbour entry for it, as
        # a booting VM's gratuitous ARP makes its neighbours do; else they keep sending to the old interface's MAC
        # until the entry goes stale, about 30 s (the kernel's base_reachable_time).
        _run("ip", "neigh", "flush", "to", address, "dev", c.bridge, check=False)
        for other in self.namespaces():
            if other != namespace:
                _run("ip", "-n", other, "neigh", "flush", "to", address, check=False)
        return namespace

    def refresh_env(self) -> list[str]:
        """Every running node's sshd takes the fabric's environment as it is now (its config rewritten, then SIGHUP,
        on which sshd re-executes itself and reads it; open sessions go on): an `up` by another checkout, or with
        other settings, must reach nodes an earlier `up` started. Returns the addresses refreshed."""
        done = []
        for pid_file in sorted((Path(self.config.nodes_dir).parent / "sshd").glob("*/sshd.pid")):
            address = pid_file.parent.name
            host_key = self.node_dir(address) / "etc" / "ssh" / "ssh_host_ed25519_key"
            try:
                pid = int(pid_file.read_text().strip())
                os.kill(pid, 0)  # a deleted VM's sshd is gone: nothing to tell
            except (OSError, ValueError):
                continue
            self._write_sshd_config(address, self.config.namespace(address), host_key)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGHUP)
                done.append(address)
        return done

    def _start_sshd(self, address: str, namespace: str, host_key: Path) -> None:
        run = self._write_sshd_config(address, namespace, host_key)
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege-separation directory
        _run("ip", "netns", "exec", namespace, SSHD, "-f", str(run / "sshd_config"), "-E", str(run / "sshd.log"))

    def _write_sshd_config(self, address: str, namespace: str, host_key: Path) -> Path:
        node, run = self.node_dir(address), self._sshd_dir(address)
        run.mkdir(parents=True, exist_ok=True)
        # `ip netns exec` bind-mounts /etc/netns/NS/* over /etc: in this namespace only, the image's user logs in
        # to the node's directory, as uid 0 (what passwordless sudo gives on the real image).
        etc = _NETNS_ETC / namespace
        etc.mkdir(parents=True, exist_ok=True)
        passwd = [line for line in Path("/etc/passwd").read_text().splitlines()
                  if not line.startswith(f"{IMAGE_USER}:")]
        passwd.append(f"{IMAGE_USER}:x:0:0:fake node {address}:{node}:/bin/bash")
        (etc / "passwd").write_text("\n".join(passwd) + "\n")
        (etc / "hosts").write_text(f"127.0.0.1 localhost\n{self.config.host_address} {CDN_NAME}\n")
        env = {"PATH": os.pathsep.join([*self.config.path, "/usr/local/bin", "/usr/bin", "/bin"]),
               "SANDBOX_NODE_HOST": address, "SANDBOX_NODE_DIR": str(node),
               **{k: v.replace("${SANDBOX_NODE_HOST}", address) for k, v in self.config.env.items()}}
        setenv = " ".join(f'{k}="{_sshd_quote(k, v)}"' for k, v in env.items())
        (run / "sshd_config").write_text("\n".join([
            f"ListenAddress {address}:22",
            f"HostKey {host_key}",
            f"AuthorizedKeysFile {node}/.ssh/authorized_keys",
            f"PidFile {run}/sshd.pid",
            "UsePAM no",
            # The node's directory belongs to whoever runs the sandbox, not to the node's uid 0.
            "StrictModes no",
            "PermitRootLogin prohibit-password",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            f"AllowUsers {IMAGE_USER}",
            "MaxStartups 64:30:128",
            "MaxSessions 64",
            f"SetEnv {setenv}",
            "",
        ]))
        return run

    def firewall(self, address: str, rules: Iterable[Mapping[str, Any]]) -> None:
        """The VM's security rules, in place of whatever its namespace had: ingress only what a rule allows."""
        namespace = self.config.namespace(address)
        try:
            ruleset = nft_ruleset(rules)
        except ValueError as exc:
            raise FabricError(str(exc)) from None
        _run("ip", "netns", "exec", namespace, "nft", "-f", "-", stdin=ruleset)

    def isolate(self, address: str) -> None:
        """The VM stops answering, as a lost cloud host usually does: every packet in and out of its namespace is
        dropped (a chain ahead of its firewall's), while its processes and the API's view of it stay."""
        ruleset = ("table inet kimi_lost {\n"
                   "  chain input { type filter hook input priority -10; policy drop; }\n"
                   "  chain output { type filter hook output priority -10; policy drop; }\n}\n")
        _run("ip", "netns", "exec", self.config.namespace(address), "nft", "-f", "-", stdin=ruleset)

    def shutdown(self, address: str) -> list[str]:
        """The VM is gone: everything that ran on it ends, its network goes; its directory stays (the caller's)."""
        return self.end_namespace(self.config.namespace(address))

    def end_namespace(self, namespace: str) -> list[str]:
        for attempt in range(50):
            pids = [int(p) for p in _run("ip", "netns", "pids", namespace, check=False).stdout.split()]
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL if attempt else signal.SIGTERM)
            time.sleep(0.1)
        left = _run("ip", "netns", "pids", namespace, check=False).stdout.split()
        _run("ip", "netns", "del", namespace, check=False)
        shutil.rmtree(_NETNS_ETC / namespace, ignore_errors=True)
        return [f"processes {', '.join(left)} of {namespace} did not end"] if left else []


def _sshd_quote(key: str, value: str) -> str:
    if '"' in value or "\n" in value:
        raise FabricError(f"the node environment's {key} holds a quote or a newline, which sshd's SetEnv cannot carry")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kimi_cluster.fakes.node_fabric",
                                     description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("check", help="say whether this machine can run a fabric")
    teardown = sub.add_parser("teardown", help="remove a fabric's nodes, bridge and route")
    teardown.add_argument("config", help="the fabric's JSON file")
    args = parser.parse_args(argv)
    if args.command == "check":
        needs = missing()
        print("ready" if not needs else "missing: " + "; ".join(needs))
        return 1 if needs else 0
    problems = Fabric(FabricConfig.load(args.config)).teardown()
    for problem in problems:
        print(f"LEFT: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
