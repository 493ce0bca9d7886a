"""The SSH key rules: what an OpenSSH public key looks like, and why a private key text cannot serve as the deploy key.

pulumi-command is given the private key and no passphrase, so a protected, public or misplaced key is refused here,
before anything bills. The key's text is inspected, never quoted.
"""

from __future__ import annotations

import base64
import binascii
import re

from kimi_cluster.settings.keys import NAMESPACE

SSH_PUBLIC_KEY_RE = re.compile(
    r"(ssh-ed25519|ssh-rsa|ecdsa-sha2-nistp(256|384|521)|sk-ssh-ed25519@openssh\.com) [A-Za-z0-9+/=]+"
    r"( [^\x00-\x1f\x7f]*)?")


DEPLOY_KEY_HINT = ("make a deploy key without a passphrase: ssh-keygen -t ed25519 -N '' -f ~/.ssh/kimi-deploy, then "
                   f"pulumi config set {NAMESPACE}:sshPublicKey \"$(cat ~/.ssh/kimi-deploy.pub)\" and "
                   f"pulumi config set --secret {NAMESPACE}:sshPrivateKey < ~/.ssh/kimi-deploy")


def _openssh_cipher(text: str) -> str | None:
    """The cipher name inside an `-----BEGIN OPENSSH PRIVATE KEY-----` block ("none" when unencrypted), or None.

    Format: "openssh-key-v1\\0", then a uint32-length-prefixed cipher name (OpenSSH's PROTOCOL.key).
    """
    body = re.search(r"-----BEGIN OPENSSH PRIVATE KEY-----(.*?)-----END OPENSSH PRIVATE KEY-----", text, re.S)
    if not body:
        return None
    try:
        blob = base64.b64decode("".join(body.group(1).split()), validate=True)
    except (ValueError, binascii.Error):
        return None
    magic = b"openssh-key-v1\0"
    if not blob.startswith(magic) or len(blob) < len(magic) + 4:
        return None
    size = int.from_bytes(blob[len(magic):len(magic) + 4], "big")
    return blob[len(magic) + 4:len(magic) + 4 + size].decode("ascii", "replace")


def private_key_problem(text: str) -> str | None:
    """Why `text` cannot serve as sshPrivateKey, or None. Never quotes the text: it is a secret.

    pulumi-command parses the key with golang.org/x/crypto/ssh.ParsePrivateKey and is given no passphrase, so a
    passphrase-protected key would fail every node step after the VMs are billing.
    """
    stripped = text.strip()
    if SSH_PUBLIC_KEY_RE.fullmatch(stripped.splitlines()[0] if stripped else ""):
        return "holds a public key (the .pub file); give the private half: --secret < ~/.ssh/kimi-deploy"
    if "\n" not in stripped and "PRIVATE KEY" not in stripped and stripped.startswith(("~", "/", "./", "$")):
        return ("looks like a file name, not the key itself: set the file's content with "
                f"pulumi config set --secret {NAMESPACE}:sshPrivateKey < FILE")
    cipher = _openssh_cipher(stripped)
    encrypted = (cipher not in (None, "none") or "Proc-Type: 4,ENCRYPTED" in stripped
                 or "-----BEGIN ENCRYPTED PRIVATE KEY-----" in stripped
                 or bool(re.search(r"^Encryption: (?!none\s*$)", stripped, re.M)))  # PuTTY's .ppk
    if encrypted:
        return "is protected by a passphrase, which the node commands cannot type; " + DEPLOY_KEY_HINT
    return None

