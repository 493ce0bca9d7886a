"""What the verifier checks: an endpoint root, the served model id, the key, the CA it must chain to and the time
allowed per check."""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
import urllib.parse
from dataclasses import dataclass, field

DEFAULT_MODEL = "moonshotai/Kimi-K3.1-Pro"
# The time one check may take in total, all its requests included. One request at "max" effort
# on a 3T-class model can think for minutes (8192 tokens at 50 tokens/s is under 3 min), and the
# tool_calls check makes up to four; 900 s bounds a hung endpoint without failing a healthy one.
DEFAULT_TIMEOUT_S = 900.0
API_KEY_ENV = "KIMI_API_KEY"


def normalize_base_url(url: str) -> str:
    """Endpoint root without a trailing slash or /v1, so paths can always start with /v1."""
    if not url or not re.match(r"^https?://[^/\s]+", url.strip()) or not _host_and_port(url.strip()):
        raise ValueError(f"base URL must look like http://HOST:PORT, got {url!r}")
    url = url.strip().rstrip("/")
    if url.endswith("/v1"):
        url = url[: -len("/v1")]
    return url


def _host_and_port(url: str) -> bool:
    """Whether the URL parses to a host and a TCP port (or none): an unclosed IPv6 bracket or a port of 99999 made
    every check fail on its own, each with the parser's error."""
    try:
        parts = urllib.parse.urlsplit(url)
        return bool(parts.hostname) and (parts.port is None or parts.port > 0)
    except ValueError:
        return False


@dataclass(frozen=True)
class Target:
    """Where and what to check. `base_url` is the endpoint root; a trailing /v1 is accepted."""

    base_url: str
    model: str = DEFAULT_MODEL
    api_key: str | None = field(default=None, repr=False)
    timeout: float = DEFAULT_TIMEOUT_S
    # PEM of the CA the endpoint's certificate must chain to (the cluster's ca_certificate output); None trusts the
    # system's CAs only.
    ca_certificate: str | None = None

    @property
    def ca_file(self) -> str | None:
        """The CA as a file, for clients that take a path (requests, curl, ssl's cafile)."""
        return ca_bundle(self.ca_certificate) if self.ca_certificate else None

    @property
    def verify(self) -> str | bool:
        """What requests' `verify=` gets: the CA file, or True (the system's CAs); never False."""
        return self.ca_file or True

    def __post_init__(self) -> None:
        object.__setattr__(self, "base_url", normalize_base_url(self.base_url))
        if not self.model:
            raise ValueError("model must name the served model id, e.g. " + DEFAULT_MODEL)
        if not self.timeout or self.timeout <= 0:
            raise ValueError(f"timeout must be a positive number of seconds, got {self.timeout!r}")


def ca_bundle(pem: str) -> str:
    """Write a CA PEM once per content to a private temp file and return its path (it is public data)."""
    if "-----BEGIN CERTIFICATE-----" not in pem:
        raise ValueError("ca_certificate is not a PEM certificate (-----BEGIN CERTIFICATE-----)")
    digest = hashlib.sha256(pem.encode()).hexdigest()[:16]
    path = os.path.join(tempfile.gettempdir(), f"kimi-verify-ca-{os.getuid()}-{digest}.pem")
    if not os.path.exists(path):
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".kimi-ca-")
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(pem if pem.endswith("\n") else pem + "\n")
        os.replace(tmp, path)
    return path
