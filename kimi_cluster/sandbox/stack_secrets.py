"""A sandbox stack's secret config, set once and kept while it is unchanged.

Each up writes the stack's config file anew from the checkout's (kimi_cluster/sandbox/cli_stacks.py), which drops
the secrets that `pulumi config set --secret` put in it; setting them again costs a CLI start and a passphrase
key derivation each (four an up of the cluster stack, some 0.4 CPU-s apiece). A secret whose value is what was set
last time gets its ciphertext back instead: it was encrypted under the same passphrase and the same salt, which the
rewrite keeps. Whether a value changed is told by a keyed digest (HMAC-SHA256, keyed with the workdir's Pulumi
passphrase), kept in the secrets folder beside the passphrase with the ciphertext it was set as, so no value and
nothing that reveals one is kept anywhere else.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from collections.abc import Mapping
from pathlib import Path

import yaml

RECORD_NAME = "stack_secrets.json"


def ciphertexts(config_file: Path) -> dict[str, str]:
    """The secure values of a stack's config file, by key (none when there is no file)."""
    if not config_file.exists():
        return {}
    config = (yaml.safe_load(config_file.read_text()) or {}).get("config") or {}
    return {key: value["secure"] for key, value in config.items()
            if isinstance(value, dict) and isinstance(value.get("secure"), str)}


class KeptSecrets:
    """What each project's stack was last given, in `secrets_dir` (0600): per secret, its value's digest and the
    ciphertext `pulumi config set --secret` made of it. A ciphertext is kept only if the file still holds that very
    one (anything else, e.g. an older release's sandbox or a user's `pulumi config set`, may have written another)."""

    def __init__(self, secrets_dir: Path, passphrase_file: Path) -> None:
        self.path = secrets_dir / RECORD_NAME
        self.passphrase_file = passphrase_file

    def _digest(self, value: str) -> str:
        return hmac.new(self.passphrase_file.read_bytes(), value.encode(), hashlib.sha256).hexdigest()

    def _record(self) -> dict[str, dict[str, dict[str, str]]]:
        try:
            return dict(json.loads(self.path.read_text()))
        except (OSError, ValueError):
            return {}

    def unchanged(self, project: str, previous: Mapping[str, str], wanted: Mapping[str, str]) -> dict[str, str]:
        """{key: its ciphertext from `previous`} of the secrets in `wanted` whose value is the one last set, still
        in the file as it was set."""
        given = self._record().get(project) or {}
        kept = {}
        for key, value in wanted.items():
            last = given.get(key) or {}
            if key in previous and previous[key] == last.get("ciphertext") \
                    and hmac.compare_digest(str(last.get("digest", "")), self._digest(value)):
                kept[key] = previous[key]
        return kept

    def remember(self, project: str, wanted: Mapping[str, str], config_file: Path) -> None:
        """After they were set: `wanted`, the project's secrets now, and their ciphertexts in `config_file`."""
        now = ciphertexts(config_file)
        record = self._record()
        record[project] = {key: {"digest": self._digest(value), "ciphertext": now[key]}
                           for key, value in wanted.items() if key in now}
        temporary = self.path.with_suffix(".tmp")
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            json.dump(record, handle)
        os.replace(temporary, self.path)


def restore(config_file: Path, kept: Mapping[str, str]) -> None:
    """Put the kept ciphertexts back in the (rewritten) config file, as `pulumi config set --secret` wrote them."""
    if not kept:
        return
    document = yaml.safe_load(config_file.read_text()) or {}
    config = document.get("config") or {}
    config.update({key: {"secure": ciphertext} for key, ciphertext in kept.items()})
    document["config"] = config
    config_file.write_text(yaml.safe_dump(document, sort_keys=False))
