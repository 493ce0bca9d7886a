"""The tls check: the endpoint speaks TLS, and its certificate chains to the given CA and names the address dialled.

A plain-HTTP endpoint fails (the key would cross the network in clear text), as does a certificate that does not
chain to the CA (the cluster's `ca_certificate` output), one for another address, or an expired one; each failure
names why, in OpenSSL's words too.
"""

from __future__ import annotations

import hashlib
import socket
import ssl
from typing import Any
from urllib.parse import urlsplit

from kimi_cluster.checks.client import Api
from kimi_cluster.checks.results import CheckFailed


def _context(ca_file: str | None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=ca_file) if ca_file else ssl.create_default_context()
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


def _verify_failure(exc: ssl.SSLCertVerificationError, host: str, with_ca: bool) -> str:
    why = exc.verify_message or str(exc)
    if exc.verify_code in (19, 20, 21):  # self-signed in chain, unknown issuer, unable to verify the first cert
        source = "the CA the verifier was given (ca_certificate)" if with_ca else "any CA this machine trusts"
        return f"the certificate does not chain to {source}: {why}"
    if exc.verify_code == 62:  # X509_V_ERR_HOSTNAME_MISMATCH, also for IP addresses
        return f"the certificate is not valid for {host}: {why}"
    if exc.verify_code == 10:
        return f"the certificate has expired: {why}"
    return f"the certificate was refused: {why}"


def check_tls(api: Api) -> tuple[str, dict[str, Any]]:
    parts = urlsplit(api.target.base_url)
    if parts.scheme != "https":
        raise CheckFailed(f"the endpoint {api.target.base_url} is plain HTTP: the API key and every prompt would "
                          "cross the network in clear text; serve it behind TLS (https://)")
    host = parts.hostname or ""
    port = parts.port or 443
    ca_file = api.target.ca_file
    try:
        with socket.create_connection((host, port), timeout=max(0.1, api.deadline.remaining())) as raw:
            with _context(ca_file).wrap_socket(raw, server_hostname=host) as conn:
                cert = conn.getpeercert() or {}
                der = conn.getpeercert(binary_form=True) or b""
                version = conn.version()
    except ssl.SSLCertVerificationError as exc:
        raise CheckFailed(f"TLS to {host}:{port} failed: {_verify_failure(exc, host, bool(ca_file))}") from None
    except ssl.SSLError as exc:
        raise CheckFailed(f"TLS handshake with {host}:{port} failed: {exc.reason or exc}") from None
    except OSError as exc:
        raise CheckFailed(f"could not connect to {host}:{port}: {exc}") from None
    alt_names = cert.get("subjectAltName", ())
    names = [str(value) for _, value in alt_names] if isinstance(alt_names, tuple) else []
    metrics = {
        "tls_version": version,
        "subject_alt_names": names,
        "not_after": cert.get("notAfter"),
        "sha256": hashlib.sha256(der).hexdigest(),
        "ca": "given" if ca_file else "system",
    }
    trusted = "the given CA" if ca_file else "a system CA"
    return f"{version}, certificate for {', '.join(names) or host} chains to {trusted}, valid until " \
           f"{cert.get('notAfter')}", metrics
