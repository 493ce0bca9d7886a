"""What cloud-init's first boot does on a fake node (kimi_cluster/fakes/node_fabric.py) with the user_data this
project sends: the keys of its `ssh_keys` (cloud-init's cc_ssh module) and nothing else."""

from __future__ import annotations

import base64
import binascii
import contextlib
import os
import subprocess
from pathlib import Path
from typing import Any

import yaml


def apply_cloud_config(node: Path, user_data: str | None) -> Path:
    """cloud-init's cc_ssh for the keys this project sends: the given ed25519 pair becomes the only host key.

    Without one (user_data empty), a fresh key is made, as the image's first boot would.
    """
    etc_ssh = node / "etc" / "ssh"
    etc_ssh.mkdir(parents=True, exist_ok=True)
    key = etc_ssh / "ssh_host_ed25519_key"
    doc = _cloud_config(user_data)
    keys = doc.get("ssh_keys") or {}
    for stale in etc_ssh.glob("ssh_host_*"):
        stale.unlink()
    if keys.get("ed25519_private"):
        fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(str(keys["ed25519_private"]).strip() + "\n")
        key.with_suffix(".pub").write_text(str(keys.get("ed25519_public") or "").strip() + "\n")
    else:
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True,
                       capture_output=True)
    return key


def _cloud_config(user_data: str | None) -> dict[str, Any]:
    if not user_data:
        return {}
    text = user_data
    if not text.lstrip().startswith("#cloud-config"):
        with contextlib.suppress(binascii.Error, UnicodeDecodeError):
            text = base64.b64decode(text, validate=True).decode()
    if not text.lstrip().startswith("#cloud-config"):
        return {}
    doc = yaml.safe_load(text)
    return doc if isinstance(doc, dict) else {}
