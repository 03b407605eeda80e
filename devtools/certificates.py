"""A private certificate authority for TLS in development and tests (``cryptography``).

``CertificateAuthority.create(directory)`` writes a CA (``ca.pem``, its key kept in memory only)
and ``issue(name, hosts)`` a server or client certificate signed by it, with the host names and
IP addresses it is valid for (subjectAltName: what a verifying client checks). Keys are written
mode 0600. Used by the embedded Redis in TLS mode (``devtools.embedded_redis``), the embedded
Sentinel set and the tests of ``rediss://`` end to end.
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

VALID_DAYS = 30


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
    """A CA whose certificate is ``ca_file``; ``issue`` signs certificates with it."""

    def __init__(self, directory: Path, key: ec.EllipticCurvePrivateKey, cert: x509.Certificate):
        self.directory = directory
        self._key = key
        self._cert = cert
        self.ca_file = directory / "ca.pem"

    @classmethod
    def create(cls, directory: Path, name: str = "agent-runtime test CA") -> CertificateAuthority:
        """A new CA (P-256, valid ``VALID_DAYS`` days) with its certificate written to ``directory/ca.pem``."""
        directory.mkdir(parents=True, exist_ok=True)
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = datetime.datetime.now(datetime.timezone.utc)
        cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256())
        )
        ca = cls(directory, key, cert)
        ca.ca_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        return ca

    def issue(self, name: str, hosts: tuple[str, ...] = ("127.0.0.1", "localhost")) -> IssuedCertificate:
        """A certificate for ``name`` valid for ``hosts`` (IP addresses or DNS names), usable by a
        server and as a client certificate; written to ``<name>.pem`` and ``<name>.key``."""
        key = ec.generate_private_key(ec.SECP256R1())
        names: list[x509.GeneralName] = []
        for host in hosts:
            try:
                names.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                names.append(x509.DNSName(host))
        now = datetime.datetime.now(datetime.timezone.utc)
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(self._cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                critical=False,
            )
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()), critical=False)
            .sign(self._key, hashes.SHA256())
        )
        issued = IssuedCertificate(self.directory / f"{name}.pem", self.directory / f"{name}.key")
        issued.cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        key_pem = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        _write_private(issued.key_file, key_pem)
        return issued
