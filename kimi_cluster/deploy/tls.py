"""The endpoint's TLS material: a per-stack certificate authority and a server certificate for the head's address.

Both are made once at create time (like the API key in kimi_cluster/deploy/generated_secret.py) and kept in the stack's
state,
private keys as secret outputs. Clients trust the CA certificate (the `ca_certificate` output); the server
certificate names the head's public IP (and any DNS names given) as subject alternative names, so a client checks
it against the address it dials. A new address replaces only the server certificate: the CA, and so every client's
trust, stays. A server certificate also renews itself on the first `up` within RENEW_DAYS of its expiry.

Stable names: state records each provider pickled by reference (module path + class name), and `destroy` of an
existing stack unpickles it from there. Never rename or move this module or `_CaProvider` / `_ServerCertProvider`.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import ipaddress
from collections.abc import Sequence
from typing import Any

import pulumi
import pulumi.dynamic as dyn
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from kimi_cluster.deploy.unknowns import is_unknown

CA_DAYS = 3650
SERVER_DAYS = 825  # the longest validity Apple's TLS policy accepts for a server certificate
RENEW_DAYS = 60


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> str:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption()).decode()


def _cert_pem(cert: x509.Certificate) -> str:
    return cert.public_bytes(serialization.Encoding.PEM).decode()


def make_ca(common_name: str, days: int = CA_DAYS, permitted_dns_names: Sequence[str] = ()) -> tuple[str, str]:
    """(certificate PEM, private key PEM) of a new self-signed CA that may sign server certificates only.

    With `permitted_dns_names` (apiHostname) the CA carries a critical name constraint (RFC 5280, 4.2.1.10): a client
    that trusts it accepts DNS names under those names only, so its key cannot vouch for api.anthropic.com. IP
    addresses stay unconstrained: the head's address can change while the CA, which every client trusts, is kept.
    """
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name),
                      x509.NameAttribute(NameOID.ORGANIZATION_NAME, "kimi-cluster")])
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=days))
        # path_length 0: this CA signs leaf certificates and nothing else.
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
                                     encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
    )
    if permitted_dns_names:
        cert = cert.add_extension(x509.NameConstraints(
            permitted_subtrees=[x509.DNSName(n) for n in permitted_dns_names], excluded_subtrees=None), critical=True)
    return _cert_pem(cert.sign(key, hashes.SHA256())), _key_pem(key)


def make_server_certificate(ca_cert_pem: str, ca_key_pem: str, ip_addresses: Sequence[str],
                            dns_names: Sequence[str] = (), days: int = SERVER_DAYS) -> tuple[str, str]:
    """(certificate PEM, private key PEM) of a server certificate signed by the CA, for these addresses and names."""
    if not ip_addresses and not dns_names:
        raise ValueError("a server certificate needs at least one IP address or DNS name")
    ca_cert = x509.load_pem_x509_certificate(ca_cert_pem.encode())
    ca_key = serialization.load_pem_private_key(ca_key_pem.encode(), password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise ValueError("the CA key is not an EC key")
    key = ec.generate_private_key(ec.SECP256R1())
    sans: list[x509.GeneralName] = [x509.IPAddress(ipaddress.ip_address(a)) for a in ip_addresses]
    sans += [x509.DNSName(n) for n in dns_names]
    first = str(ip_addresses[0]) if ip_addresses else dns_names[0]
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, first)]))
        .issuer_name(ca_cert.subject).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=False, key_cert_sign=False,
                                     crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        # Python 3.13's default (VERIFY_X509_STRICT) refuses a leaf without an authority key identifier.
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return _cert_pem(cert), _key_pem(key)


def not_after(cert_pem: str) -> dt.datetime:
    return x509.load_pem_x509_certificate(cert_pem.encode()).not_valid_after_utc


def fingerprint(cert_pem: str) -> str:
    """SHA-256 of the certificate's DER form, as `openssl x509 -fingerprint -sha256` shows it (without colons)."""
    der = x509.load_pem_x509_certificate(cert_pem.encode()).public_bytes(serialization.Encoding.DER)
    return hashlib.sha256(der).hexdigest()


def check_key_matches(cert_pem: str, key_pem: str) -> None:
    """Raise if the private key is not the certificate's (a mismatched pair fails every TLS handshake)."""
    cert = x509.load_pem_x509_certificate(cert_pem.encode())
    key = serialization.load_pem_private_key(key_pem.encode(), password=None)
    spki = serialization.PublicFormat.SubjectPublicKeyInfo
    if key.public_key().public_bytes(serialization.Encoding.DER, spki) != \
            cert.public_key().public_bytes(serialization.Encoding.DER, spki):
        raise ValueError("the private key does not belong to the first certificate of the chain")


# ---- Pulumi resources ----------------------------------------------------------------------------------------------


class _CaProvider(dyn.ResourceProvider):
    """Stateless: holds nothing on self, so nothing sensitive is pickled into the provider blob."""

    # Not a secret (see kimi_cluster.deploy.hyperstack_providers.providers.HyperstackProvider): stateless, pickled
    # by reference, and its diff never reads `__provider`.
    serialize_as_secret_always = False


    def create(self, props: dict[str, Any]) -> dyn.CreateResult:
        # .get: CAs of stacks made before the constraint existed have no such input.
        permitted = [str(n) for n in props.get("permitted_dns_names") or []]
        cert, key = make_ca(str(props["common_name"]), permitted_dns_names=permitted)
        return dyn.CreateResult(id_=f"ca-{fingerprint(cert)[:16]}", outs={
            "common_name": props["common_name"], "permitted_dns_names": permitted, "cert_pem": cert, "key_pem": key})

    def diff(self, _id: str, _olds: dict[str, Any], _news: dict[str, Any]) -> dyn.DiffResult:
        # Every client trusts this certificate: it must outlive every run, whatever else changes. A constraint
        # set later (apiHostname on an existing stack) applies only to a CA made anew (`pulumi up --replace URN`).
        return dyn.DiffResult(changes=False)


class CertificateAuthority(dyn.Resource, module="kimi", name="CertificateAuthority"):
    """The stack's own CA; `key_pem` is a secret output and never a plain input anywhere."""

    cert_pem: pulumi.Output[str]
    key_pem: pulumi.Output[str]

    def __init__(self, name: str, common_name: str, permitted_dns_names: Sequence[str] = (),
                 opts: pulumi.ResourceOptions | None = None) -> None:
        opts = pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(additional_secret_outputs=["key_pem"]))
        super().__init__(_CaProvider(), name, {"common_name": common_name,
                                               "permitted_dns_names": list(permitted_dns_names),
                                               "cert_pem": None, "key_pem": None}, opts)


class _ServerCertProvider(dyn.ResourceProvider):
    """Signs a server certificate with the CA it is given (as a secret input); stateless like the CA's."""

    # Not a secret (see kimi_cluster.deploy.hyperstack_providers.providers.HyperstackProvider): stateless, pickled
    # by reference, and its diff never reads `__provider`.
    serialize_as_secret_always = False


    def create(self, props: dict[str, Any]) -> dyn.CreateResult:
        ips = [str(a) for a in props.get("ip_addresses") or []]
        names = [str(n) for n in props.get("dns_names") or []]
        cert, key = make_server_certificate(props["ca_cert_pem"], props["ca_key_pem"], ips, names)
        return dyn.CreateResult(id_=f"cert-{fingerprint(cert)[:16]}", outs={
            **props, "cert_pem": cert, "key_pem": key, "not_after": not_after(cert).isoformat()})

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> dyn.DiffResult:
        # In a preview an address may not be known yet (a VM to be replaced): that may change the certificate.
        replaces = [k for k in ("ip_addresses", "dns_names")
                    if is_unknown(news.get(k)) or list(olds.get(k) or []) != list(news.get(k) or [])]
        if olds.get("ca_cert_pem") != news.get("ca_cert_pem"):
            replaces.append("ca_cert_pem")
        current = olds.get("cert_pem")
        if current and not_after(current) - _now() < dt.timedelta(days=RENEW_DAYS):
            replaces.append("cert_pem")
        return dyn.DiffResult(changes=bool(replaces), replaces=replaces, delete_before_replace=False)


class ServerCertificate(dyn.Resource, module="kimi", name="ServerCertificate"):
    """A server certificate signed by `ca`; `key_pem` is a secret output, the CA's key a secret input."""

    cert_pem: pulumi.Output[str]
    key_pem: pulumi.Output[str]

    def __init__(self, name: str, ca: CertificateAuthority, ip_addresses: pulumi.Input[Sequence[str]],
                 dns_names: Sequence[str] = (), opts: pulumi.ResourceOptions | None = None) -> None:
        opts = pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(
            additional_secret_outputs=["key_pem", "ca_key_pem"]))
        super().__init__(_ServerCertProvider(), name, {
            "ca_cert_pem": ca.cert_pem,
            "ca_key_pem": pulumi.Output.secret(ca.key_pem),
            "ip_addresses": ip_addresses,
            "dns_names": list(dns_names),
            "cert_pem": None,
            "key_pem": None,
            "not_after": None,
        }, opts)


def endpoint_certificate(parent: pulumi.Resource, name: str, *, own_chain: list[str] | None,
                         own_key: pulumi.Output[str] | None, ca_name: str, dns_names: list[str],
                         public_ip: pulumi.Output[str], key_setting: str, cert_setting: str
                         ) -> tuple[pulumi.Input[str], pulumi.Input[str], pulumi.Output[str]]:
    """(server certificate chain, CA certificate clients trust, server private key as a secret) of the endpoint.

    Your own certificate (`own_chain`, from `cert_setting`, with `own_key` from `key_setting`) is used as given, its
    last certificate being the CA; otherwise the stack's own CA signs a certificate for the endpoint VM's address.
    """
    if own_chain is not None:
        blocks = own_chain
        if own_key is None:
            raise ValueError(f"{key_setting} is required with {cert_setting}; set it with: "
                             f"pulumi config set --secret {key_setting} < server.key")

        def checked(key: str) -> str:
            try:
                check_key_matches(blocks[0], key)
            except ValueError as exc:
                raise ValueError(f"{key_setting}: {exc} ({cert_setting})") from None
            return key

        return "".join(blocks), blocks[-1], pulumi.Output.secret(own_key.apply(checked))
    child = pulumi.ResourceOptions(parent=parent)
    ca = CertificateAuthority(f"{name}-ca", common_name=ca_name, permitted_dns_names=dns_names, opts=child)
    cert = ServerCertificate(f"{name}-tls", ca, public_ip.apply(lambda ip: [ip]), dns_names, opts=child)
    return cert.cert_pem, ca.cert_pem, pulumi.Output.secret(cert.key_pem)
