"""A sandbox's working directory: what the sandbox owns there, one command at a time, and the secrets it makes.

`<workdir>/`: sandbox.json (services, topology, ports), secrets/ (0700), state/ and projects/ (the Pulumi CLI's
file backend and a project folder per stack, kimi_cluster/sandbox/cli_stacks.py), nodes/ (each fake node's root),
fabric.json
(the nodes' network), logs/ (the services' output) and kernel-store/ (the kernel-cache bucket's objects).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_WORKDIR = ".sandbox"
# Written into a workdir the sandbox created; without it a non-empty directory is someone else's and is refused.
MARKER = ".kimi-sandbox"


class SandboxUsageError(Exception):
    """The command cannot run as asked (nothing deployed, a conflicting topology); the message says what to do."""


@dataclass
class Workdir:
    root: Path

    @property
    def record_path(self) -> Path:
        return self.root / "sandbox.json"

    @property
    def secrets_dir(self) -> Path:
        return self.root / "secrets"

    @property
    def nodes(self) -> Path:
        return self.root / "nodes"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def kernel_store(self) -> Path:
        """The kernel-cache bucket's objects while its server is stopped; kept by destroy, like a team's bucket."""
        return self.root / "kernel-store"

    @property
    def marker(self) -> Path:
        return self.root / MARKER

    def claim(self, create: bool) -> None:
        """Own the workdir, or refuse it: a file, or a non-empty directory the sandbox did not create (whose
        secrets/ or nodes/ a destroy would delete). `create` makes it (an up); verify and destroy never do."""
        if self.root.exists() and not self.root.is_dir():
            raise SandboxUsageError(f"--workdir {self.root} is a file; give a directory the sandbox may own "
                                    f"(new or empty; default {DEFAULT_WORKDIR})")
        if self.marker.exists():
            return
        if self.root.exists() and any(self.root.iterdir()):
            if self.record_path.exists():  # made by a sandbox from before the marker: its own files
                self._mark()
                return
            raise SandboxUsageError(f"--workdir {self.root} holds files the sandbox did not create; it would own "
                                    "and later delete parts of it: give a new or empty directory")
        if create:
            self.root.mkdir(parents=True, exist_ok=True)
            self._mark()

    def _mark(self) -> None:
        self.marker.write_text(
            "created by kimi-cluster sandbox; destroy deletes only what the sandbox made here\n")

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        """One sandbox command at a time per workdir: a second `up` (or a destroy during an up) is refused."""
        if not self.root.is_dir():
            yield
            return
        with open(self.root / ".command.lock", "a+") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.seek(0)
                holder = handle.read().strip() or "another process"
                raise SandboxUsageError(f"another sandbox command ({holder}) is running in {self.root}; wait for "
                                        "it to finish, or use another --workdir") from None
            handle.seek(0)
            handle.truncate()
            handle.write(f"pid {os.getpid()}\n")
            handle.flush()
            yield

    def record(self) -> dict[str, Any]:
        if not self.record_path.exists():
            return {}
        try:
            doc = json.loads(self.record_path.read_text())
        except ValueError:
            doc = None
        if not isinstance(doc, dict):
            raise SandboxUsageError(f"{self.record_path} is not the sandbox's JSON record (edited or cut short?); "
                                    "move it away or use another --workdir")
        return doc

    def save_record(self, record: Mapping[str, Any]) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.record_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(record, indent=2) + "\n")
        os.replace(tmp, self.record_path)

    def secret(self, name: str, make: Callable[[], str]) -> str:
        """A sandbox secret kept across commands (a later `up` must not change the hub token and re-run steps)."""
        self.secrets_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        path = self.secrets_dir / name
        if not path.exists():
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as fh:
                fh.write(make() + "\n")
        return path.read_text().strip()

    def secret_path(self, name: str) -> Path:
        return self.secrets_dir / name


# ---- the secrets the sandbox makes --------------------------------------------------------------------------------


def emulator_key() -> str:
    return "sandbox-" + secrets.token_urlsafe(24)


def hf_token() -> str:
    return "hf_" + secrets.token_urlsafe(24)


def new_ssh_private_key() -> str:
    """A fresh ed25519 key in OpenSSH's format: the operator's key, which every fake node's sshd accepts."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    return Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()).decode()


def ssh_public_key_of(private_key: str) -> str:
    from cryptography.hazmat.primitives import serialization

    key = serialization.load_ssh_private_key(private_key.encode(), password=None)
    return key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                         serialization.PublicFormat.OpenSSH).decode() + " kimi-sandbox"
