"""How the operator's tools run a command on a node: over SSH, accepting only the host key the stack pinned.

The node steps reach each VM with pulumi-command over SSH, with the ed25519 host key the program generated and
cloud-init installed as the VM's only host key (components/node.py). `scripts.status` runs its probe the same way:
OpenSSH with a known_hosts file holding just that key and `StrictHostKeyChecking=yes`, so a VM answering with any
other key is refused. The private key goes to ssh in a 0600 file inside a 0700 temporary directory, never on a
command line, and is deleted when the command ends.

Any object with the same `run` method can stand in (the sandbox's NodeExecution runs node commands in a local
directory per host, the way its engine runs the steps).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import tempfile
from typing import Protocol

from components.stack_state import Connection


class NodeRunner(Protocol):
    def run(self, connection: Connection, command: str, stdin: str, timeout: float) -> tuple[int, str, str]:
        """Run `command` (shell text) on the node; (exit code, stdout, stderr)."""
        ...


class SshRunner:
    """OpenSSH to the node with the stack's pinned host key; refuses a node whose host key the stack lacks."""

    def __init__(self, ssh: str = "ssh", connect_timeout: int = 10) -> None:
        self.ssh = ssh
        self.connect_timeout = connect_timeout

    def run(self, connection: Connection, command: str, stdin: str, timeout: float) -> tuple[int, str, str]:
        if not connection.host_key:
            return 255, "", f"no pinned host key for {connection.host} in the stack's state; refusing to connect"
        if not connection.private_key:
            return 255, "", "no SSH private key in the stack's state (kimi-cluster:sshPrivateKey)"
        with tempfile.TemporaryDirectory(prefix="kimi-status-") as tmp:
            key_path = os.path.join(tmp, "id")
            fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as fh:
                fh.write(connection.private_key.rstrip("\n") + "\n")
            known = os.path.join(tmp, "known_hosts")
            where = connection.host if connection.port == 22 else f"[{connection.host}]:{connection.port}"
            with open(known, "w") as fh:
                fh.write(f"{where} {connection.host_key.strip()}\n")
            argv = [self.ssh, "-F", "/dev/null", "-i", key_path, "-p", str(connection.port),
                    "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes", "-o", "StrictHostKeyChecking=yes",
                    "-o", f"UserKnownHostsFile={known}", "-o", "GlobalKnownHostsFile=/dev/null",
                    "-o", f"ConnectTimeout={self.connect_timeout}", "-o", "LogLevel=ERROR",
                    f"{connection.user}@{connection.host}", command]
            try:
                done = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=timeout)
            except FileNotFoundError:
                return 127, "", f"{self.ssh} is not installed (OpenSSH's client is needed to reach the nodes)"
            except subprocess.TimeoutExpired:
                return 124, "", f"ssh to {connection.host} did not finish within {timeout:g} s"
        return done.returncode, done.stdout, done.stderr


def probe_command(node_root: str, storage_path: str, repo_folder: str, bytes_total: int) -> str:
    """The shell text that runs scripts/node_status.py (sent on stdin) on a node."""
    return shlex.join(["python3", "-", "--node-root", node_root, "--storage-path", storage_path,
                       "--repo-folder", repo_folder, "--bytes-total", str(bytes_total)])
