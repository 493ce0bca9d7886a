"""How the operator's tools run a command on a node: over SSH, accepting only the host key the stack pinned.

The node steps reach each VM with pulumi-command over SSH, with the ed25519 host key the program generated and
cloud-init installed as the VM's only host key (kimi_cluster/deploy/vm.py). `kimi_cluster.cli.status` runs its probe the
same way:
OpenSSH with a known_hosts file holding just that key and `StrictHostKeyChecking=yes`, so a VM answering with any
other key is refused. The private key goes to ssh in a 0600 file inside a 0700 temporary directory, never on a
command line, and is deleted when the command ends, and on every way out of the process: a normal exit (atexit),
Ctrl-C, and SIGTERM or SIGHUP (a terminal closed under `status --watch`) through `remove_key_files_on_signals`.
OpenSSH reads an identity only from a path (`-i`, which it opens more than once, checking its mode each time), so
a file it is; `ssh-add -` into a private agent would keep it off the disk but leave an agent process to clean up.

Any object with the same `run` method can stand in (the tests' recording runners do).
"""

from __future__ import annotations

import atexit
import os
import shlex
import shutil
import signal
import subprocess
import tempfile
import threading
from types import FrameType
from typing import Protocol

from kimi_cluster.operator.stack_state import Connection
from kimi_cluster.plan.steps.table import NAMES


class NodeRunner(Protocol):
    def run(self, connection: Connection, command: str, stdin: str, timeout: float) -> tuple[int, str, str]:
        """Run `command` (shell text) on the node; (exit code, stdout, stderr)."""
        ...


# Temporary directories that hold a private key right now, and the ssh processes using them, so a signal can remove
# the keys and stop the processes before the process ends (the probes run on worker threads, whose own `with`
# blocks would finish only after their ssh does).
_KEY_DIRS: set[str] = set()
_SSH_PROCS: set[subprocess.Popen[str]] = set()
_KEY_DIRS_LOCK = threading.Lock()
_STOPPING = threading.Event()  # set once the process is on its way out: no new key file, no new ssh


def remove_key_files() -> None:
    """Delete every private-key directory this process still holds, and stop the ssh processes reading them."""
    with _KEY_DIRS_LOCK:
        _STOPPING.set()
        dirs, procs = list(_KEY_DIRS), list(_SSH_PROCS)
        _KEY_DIRS.clear()
    for proc in procs:
        proc.kill()
    for path in dirs:
        shutil.rmtree(path, ignore_errors=True)


atexit.register(remove_key_files)


def remove_key_files_on_signals(signals: tuple[int, ...] = (signal.SIGTERM, signal.SIGHUP)) -> None:
    """From the main thread: on any of `signals`, delete the key files, then exit with 128 + the signal's number."""

    def handler(signum: int, _frame: FrameType | None) -> None:
        remove_key_files()
        raise SystemExit(128 + signum)

    for sig in signals:
        signal.signal(sig, handler)


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
        with tempfile.TemporaryDirectory(prefix="kimi-status-", ignore_cleanup_errors=True) as tmp:
            with _KEY_DIRS_LOCK:
                if _STOPPING.is_set():
                    return 255, "", "the process is exiting; not connecting"
                _KEY_DIRS.add(tmp)
            try:
                return self._run(connection, command, stdin, timeout, tmp, connection.private_key,
                                 connection.host_key)
            finally:
                with _KEY_DIRS_LOCK:
                    _KEY_DIRS.discard(tmp)

    def _run(self, connection: Connection, command: str, stdin: str, timeout: float, tmp: str, private_key: str,
             host_key: str) -> tuple[int, str, str]:
        key_path = os.path.join(tmp, "id")
        fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(private_key.rstrip("\n") + "\n")
        known = os.path.join(tmp, "known_hosts")
        where = connection.host if connection.port == 22 else f"[{connection.host}]:{connection.port}"
        with open(known, "w") as fh:
            fh.write(f"{where} {host_key.strip()}\n")
        argv = [self.ssh, "-F", "/dev/null", "-i", key_path, "-p", str(connection.port),
                "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes", "-o", "StrictHostKeyChecking=yes",
                "-o", f"UserKnownHostsFile={known}", "-o", "GlobalKnownHostsFile=/dev/null",
                "-o", f"ConnectTimeout={self.connect_timeout}", "-o", "LogLevel=ERROR",
                f"{connection.user}@{connection.host}", command]
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True)
        except FileNotFoundError:
            return 127, "", f"{self.ssh} is not installed (OpenSSH's client is needed to reach the nodes)"
        with _KEY_DIRS_LOCK:
            _SSH_PROCS.add(proc)
            if _STOPPING.is_set():  # a signal came between the key file and this ssh
                proc.kill()
        try:
            out, err = proc.communicate(stdin, timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            return 124, "", f"ssh to {connection.host} did not finish within {timeout:g} s"
        finally:
            with _KEY_DIRS_LOCK:
                _SSH_PROCS.discard(proc)
        return proc.returncode, out, err


def probe_command(node_root: str, storage_path: str, repo_folder: str, bytes_total: int) -> str:
    """The shell text that runs kimi_cluster/node/node_status.py (sent on stdin) on a node; it looks for the step
    table's steps (kimi_cluster/plan/steps/table.py), in its order."""
    return shlex.join(["python3", "-", "--node-root", node_root, "--storage-path", storage_path,
                       "--repo-folder", repo_folder, "--bytes-total", str(bytes_total), "--steps", ",".join(NAMES)])
