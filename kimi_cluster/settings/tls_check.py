"""Checks of a bring-your-own server certificate (kimi-cluster:tlsCertificate and tlsPrivateKey) before anything bills.

A chain that parses can still fail every handshake, or fail only the readiness wait two hours into `up`: an expired or
not-yet-valid certificate, blocks that do not chain (or come in the wrong order), a leaf with no CA after it, a CA in
the leaf's place, a leaf that does not name the hostname clients dial, a private key that is not the leaf's, a key too
weak or a signature hash too broken for clients, a leaf whose key usage forbids serving TLS. Each
check here answers with one sentence or None; a private key is never quoted (it is a secret).

The rules follow what a TLS client does with the chain (RFC 5280 path building, RFC 6125 name matching): each block
is issued and signed by the next, the last is the CA clients trust (exported as ca_certificate), and the leaf's
subject alternative names carry the hostname (a wildcard stands for one whole left-most label only).
"""

from __future__ import annotations

import datetime as dt

from cryptography import x509
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed448, ed25519, rsa
from cryptography.hazmat.primitives.asymmetric.types import CertificatePublicKeyTypes
from cryptography.x509.oid import ExtendedKeyUsageOID

_SPKI = (serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
# A bring-your-own leaf this close to its end is accepted with a warning (kimi_cluster/deploy/tls.py renews its own at
# 60 days).
RENEW_WARN_DAYS = 30
# What TLS clients still accept (CA/Browser Forum baseline requirements, Go's crypto/x509 and OpenSSL's default
# security level): RSA of 2048 bits or more, EC on P-256 or a larger curve.
RSA_MIN_BITS = 2048
EC_MIN_BITS = 256
# Signature hashes clients refuse outright (SHA-1 since 2017, MD5 long before).
_BROKEN_HASHES = (hashes.SHA1, hashes.MD5)


def _is_ca(cert: x509.Certificate) -> bool:
    try:
        return bool(cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca)
    except x509.ExtensionNotFound:
        return False


def _label(cert: x509.Certificate) -> str:
    names = cert.subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)
    text = str(names[0].value) if names else cert.subject.rfc4514_string() or "(no subject)"
    return repr(text[:80])


def names_host(cert: x509.Certificate, hostname: str) -> bool:
    """Whether the leaf's DNS subject alternative names cover `hostname` (RFC 6125: no common-name fallback)."""
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return False
    host = hostname.lower()
    for name in sans.get_values_for_type(x509.DNSName):
        pattern = name.lower().rstrip(".")
        if pattern == host:
            return True
        # "*.example.com" covers "api.example.com", never "example.com" or "a.b.example.com".
        wildcard = pattern.startswith("*.") and pattern.count(".") >= 2
        if wildcard and "." in host and host.split(".", 1)[1] == pattern[2:]:
            return True
    return False


def _key_strength_problem(cert: x509.Certificate) -> str | None:
    try:
        key = cert.public_key()
    except (ValueError, UnsupportedAlgorithm):
        return f"certificate {_label(cert)} holds a public key of a kind TLS clients do not take"
    if isinstance(key, rsa.RSAPublicKey) and key.key_size < RSA_MIN_BITS:
        return f"certificate {_label(cert)} holds an RSA key of {key.key_size} bits; clients refuse less than " \
               f"{RSA_MIN_BITS}"
    if isinstance(key, ec.EllipticCurvePublicKey) and key.curve.key_size < EC_MIN_BITS:
        return f"certificate {_label(cert)} holds an EC key on {key.curve.name}; clients take P-256 or larger"
    if not isinstance(key, rsa.RSAPublicKey | ec.EllipticCurvePublicKey | ed25519.Ed25519PublicKey
                      | ed448.Ed448PublicKey):
        return f"certificate {_label(cert)} holds a {type(key).__name__}, which TLS servers do not use"
    return None


def _signature_problem(cert: x509.Certificate) -> str | None:
    try:
        algorithm = cert.signature_hash_algorithm
    except UnsupportedAlgorithm:
        oid = cert.signature_algorithm_oid.dotted_string
        return f"certificate {_label(cert)} is signed with an algorithm clients do not know ({oid})"
    if isinstance(algorithm, _BROKEN_HASHES):
        return (f"certificate {_label(cert)} is signed with {algorithm.name.upper().replace('SHA1', 'SHA-1')}, "
                "which every current client refuses: have it issued again with SHA-256")
    return None


def _usage_problem(leaf: x509.Certificate) -> str | None:
    """A leaf that restricts its use must allow a TLS server's: signing the handshake, serverAuth."""
    try:
        usage = leaf.extensions.get_extension_for_class(x509.KeyUsage).value
    except x509.ExtensionNotFound:
        usage = None
    if usage is not None and not usage.digital_signature and not (
            isinstance(leaf.public_key(), rsa.RSAPublicKey) and usage.key_encipherment):
        return (f"leaf {_label(leaf)} has a key usage without digitalSignature, so it cannot sign a TLS handshake: "
                "have it issued with key usage digitalSignature (and keyEncipherment for RSA)")
    try:
        purposes = leaf.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    except x509.ExtensionNotFound:
        return None
    if ExtendedKeyUsageOID.SERVER_AUTH not in purposes and ExtendedKeyUsageOID.ANY_EXTENDED_KEY_USAGE not in purposes:
        return (f"leaf {_label(leaf)} has an extended key usage without serverAuth: clients refuse it for a "
                "server; have it issued with extended key usage serverAuth")
    return None


def chain_problem(chain_pem: str, hostname: str, now: dt.datetime | None = None) -> str | None:
    """Why the chain cannot serve `hostname` to clients that trust its last certificate, or None."""
    if "PRIVATE KEY" in chain_pem:
        return ("holds a private key (not shown): the key goes in the secret kimi-cluster:tlsPrivateKey, never in the "
                "plain tlsCertificate (it would sit in Pulumi.<stack>.yaml and the state in clear)")
    try:
        certs = x509.load_pem_x509_certificates(chain_pem.encode())
    except ValueError:
        return "is not a PEM certificate chain"
    now = now or dt.datetime.now(dt.UTC)
    if len(certs) < 2:
        return ("holds one certificate: give the whole chain, leaf first, ending with the CA clients trust (that "
                "last one is exported as ca_certificate for clients to pin)")
    leaf, ca = certs[0], certs[-1]
    if _is_ca(leaf):
        return f"starts with a CA certificate ({_label(leaf)}), not a server certificate: put the leaf first"
    if not _is_ca(ca):
        return (f"ends with {_label(ca)}, which is not a CA certificate: end the chain with the CA clients trust "
                "(the order is leaf, intermediates, CA)")
    for cert in certs:
        if cert.not_valid_before_utc > now:
            return f"certificate {_label(cert)} is not valid before {cert.not_valid_before_utc:%Y-%m-%d %H:%M} UTC"
        if cert.not_valid_after_utc <= now:
            return f"certificate {_label(cert)} expired on {cert.not_valid_after_utc:%Y-%m-%d %H:%M} UTC"
    for cert in certs:
        problem = _key_strength_problem(cert)
        if problem:
            return problem
    for child, parent in zip(certs, certs[1:], strict=False):
        if parent is not ca and not _is_ca(parent):
            return f"certificate {_label(parent)} signs {_label(child)} but is not a CA certificate"
        # Before verifying: cryptography refuses a SHA-1 signature as unsupported, which reads as a broken chain.
        problem = _signature_problem(child)
        if problem:
            return problem
        try:
            child.verify_directly_issued_by(parent)
        except (ValueError, TypeError, InvalidSignature):
            return (f"certificate {_label(child)} is not issued by the next one, {_label(parent)}: the blocks do "
                    "not chain (the order is leaf, intermediates, CA)")
    problem = _usage_problem(leaf)
    if problem:
        return problem
    if not names_host(leaf, hostname):
        return (f"leaf {_label(leaf)} does not name kimi-cluster:apiHostname {hostname!r} among its DNS subject "
                "alternative names: every client would refuse it")
    return None


def key_problem(chain_pem: str, key_pem: str) -> str | None:
    """Why `key_pem` is not the chain's leaf key (or no usable key at all), or None. Never quotes the key."""
    try:
        key = serialization.load_pem_private_key(key_pem.strip().encode(), password=None)
    except TypeError:
        return "is protected by a passphrase, which the proxy cannot type: give the key unencrypted (as a secret)"
    except ValueError:
        return "is not a PEM private key (-----BEGIN PRIVATE KEY----- ...; the value is not shown)"
    try:
        leaf = x509.load_pem_x509_certificates(chain_pem.encode())[0]
    except (ValueError, IndexError):
        return None  # the chain's own check says what is wrong with it
    public: CertificatePublicKeyTypes = leaf.public_key()
    if key.public_key().public_bytes(*_SPKI) != public.public_bytes(*_SPKI):
        return (f"does not belong to the leaf certificate of kimi-cluster:tlsCertificate ({_label(leaf)}): every "
                "handshake would fail")
    return None


def split_chain(chain_pem: str) -> list[str]:
    """The PEM blocks of a chain, in order."""
    return [c.public_bytes(serialization.Encoding.PEM).decode() for c in x509.load_pem_x509_certificates(
        chain_pem.encode())]
