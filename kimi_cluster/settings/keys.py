"""The config's names: the `kimi-cluster:` namespace, and which of its keys (and the provider's) are secrets."""

from __future__ import annotations

NAMESPACE = "kimi-cluster"
SECRET_KEYS = ("hfToken", "sshPrivateKey", "kernelCacheCredentials", "tlsPrivateKey", "caretakerApiKey")
# Secrets that must be set with --secret; a plain value sits unencrypted in Pulumi.<stack>.yaml and the state.
CREDENTIAL_KEYS = (f"{NAMESPACE}:hfToken", f"{NAMESPACE}:sshPrivateKey", f"{NAMESPACE}:kernelCacheCredentials",
                   f"{NAMESPACE}:tlsPrivateKey", f"{NAMESPACE}:caretakerApiKey", "hyperstack:apiKey")
