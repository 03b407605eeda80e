"""Private certificate authorities for Redis and Sentinel over TLS (``cryptography``; EC P-256).

One module for every CA the project makes:

- ``make_ca`` and ``make_cert`` work on PEM bytes: a CA ``(key, certificate)`` and a certificate
  it signs for a list of names (``devtools.hosts_config``: a deployment's CA, its key kept by the
  operator, and each machine's certificate; ``make deploy-check-hosts``'s "unknown CA" probe);
- ``CertificateAuthority`` keeps a CA's key in memory and writes files: ``create(directory)``
  writes its certificate to ``ca.pem``, ``issue(name, hosts)`` a certificate and its key
  (``<name>.pem``, ``<name>.key``, the key mode 0600): the embedded Redis and Sentinel set in TLS
  mode (``devtools.embedded_redis``, ``devtools.embedded_sentinel``) and the ``rediss://`` tests.

Every certificate issued is valid for server and client use (Redis presents it to its primary
when it replicates, a Sentinel to the servers), names its ``hosts`` in subjectAltName (what a
verifying client checks: IP addresses as such, anything else as a DNS name) and carries the
CA's key identifier.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_DAYS = 3650  # a deployment's CA
CERT_DAYS = 825  # a deployment's server certificates (docs/deployment.md: renew before then)
TEST_DAYS = 30  # a CertificateAuthority's CA and certificates: development and tests


class CertificateError(ValueError):
    """The CA key or certificate given is not one ``make_ca`` made (not PEM, not EC)."""


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _ca_cert(key: ec.EllipticCurvePrivateKey, common_name: str, days: int) -> x509.Certificate:
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    usage = x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=True,
        crl_sign=True,
        encipher_only=False,
        decipher_only=False,
    )
    return (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(_now() - datetime.timedelta(minutes=5))
        .not_valid_after(_now() + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(usage, critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )


def _signed_cert(
    ca_key: ec.EllipticCurvePrivateKey,
    ca_cert: x509.Certificate,
    key: ec.EllipticCurvePrivateKey,
    name: str,
    hosts: tuple[str, ...],
    days: int,
) -> x509.Certificate:
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    usage = x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH])
    return (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(_now() - datetime.timedelta(minutes=5))
        .not_valid_after(_now() + datetime.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(usage, critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )


def make_ca(common_name: str = "agent-runtime deployment CA", days: int = CA_DAYS) -> tuple[bytes, bytes]:
    """A new CA: ``(key PEM, certificate PEM)``, valid ``days`` days (ten years by default)."""
    key = ec.generate_private_key(ec.SECP256R1())
    return _pem_key(key), _ca_cert(key, common_name, days).public_bytes(serialization.Encoding.PEM)


def make_cert(
    ca_key_pem: bytes, ca_cert_pem: bytes, name: str, hosts: tuple[str, ...], days: int = CERT_DAYS
) -> tuple[bytes, bytes]:
    """A certificate for ``name`` (its common name) valid for ``hosts`` (IP addresses or DNS names),
    signed by the CA ``make_ca`` returned: ``(key PEM, certificate PEM)``, valid ``days`` days.
    Raises ``CertificateError`` when the CA's key or certificate cannot be read as made by ``make_ca``."""
    try:
        ca_key = serialization.load_pem_private_key(ca_key_pem, password=None)
        ca_cert = x509.load_pem_x509_certificate(ca_cert_pem)
    except ValueError as exc:
        raise CertificateError(f"not a PEM CA key and certificate: {exc}") from None
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise CertificateError("the CA key is not an EC key made by make_ca")
    key = ec.generate_private_key(ec.SECP256R1())
    cert = _signed_cert(ca_key, ca_cert, key, name, hosts, days)
    return _pem_key(key), cert.public_bytes(serialization.Encoding.PEM)


@dataclass(frozen=True)
class IssuedCertificate:
    """A certificate and its key, as PEM files."""

    cert_file: Path
    key_file: Path


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


class CertificateAuthority:
    """A CA whose certificate is ``ca_file`` (its key only in memory); ``issue`` writes certificates
    it signs into the same directory."""

    def __init__(self, directory: Path, key: ec.EllipticCurvePrivateKey, cert: x509.Certificate, days: int):
        self.directory = directory
        self._key = key
        self._cert = cert
        self.days = days
        self.ca_file = directory / "ca.pem"

    @classmethod
    def create(
        cls, directory: Path, name: str = "agent-runtime test CA", days: int = TEST_DAYS
    ) -> CertificateAuthority:
        """A new CA valid ``days`` days (30 by default), its certificate written to ``directory/ca.pem``."""
        directory.mkdir(parents=True, exist_ok=True)
        key = ec.generate_private_key(ec.SECP256R1())
        ca = cls(directory, key, _ca_cert(key, name, days), days)
        ca.ca_file.write_bytes(ca._cert.public_bytes(serialization.Encoding.PEM))
        return ca

    def issue(self, name: str, hosts: tuple[str, ...] = ("127.0.0.1", "localhost")) -> IssuedCertificate:
        """A certificate for ``name`` valid for ``hosts``, for server and client use, as long as the
        CA; written to ``<name>.pem`` and ``<name>.key`` (mode 0600)."""
        key = ec.generate_private_key(ec.SECP256R1())
        cert = _signed_cert(self._key, self._cert, key, name, hosts, self.days)
        issued = IssuedCertificate(self.directory / f"{name}.pem", self.directory / f"{name}.key")
        issued.cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_private(issued.key_file, _pem_key(key))
        return issued
