"""The certificates of a deployment on several machines (``devtools.hosts_config``): a CA made
for the deployment (its key kept by the operator) and, per machine, a server certificate for its
address and name that Redis and Sentinel present (``cryptography``; EC P-256)."""

from __future__ import annotations

import datetime
import ipaddress

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CERT_DAYS = 825  # server certificates; the CA lives ten years


class CertificateError(ValueError):
    """The CA key given is not one ``make_ca`` made."""


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def make_ca(common_name: str = "agent-runtime deployment CA") -> tuple[bytes, bytes]:
    """A new CA: ``(key PEM, certificate PEM)``, EC P-256, valid ten years."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(_now() - datetime.timedelta(minutes=5))
        .not_valid_after(_now() + datetime.timedelta(days=3650))
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
    return _pem_key(key), cert.public_bytes(serialization.Encoding.PEM)


def make_server_cert(ca_key_pem: bytes, ca_cert_pem: bytes, name: str, address: str) -> tuple[bytes, bytes]:
    """A certificate for machine ``name`` signed by the CA: ``(key PEM, certificate PEM)``. Its names:
    ``address`` and ``name`` (what clients and Sentinels dial), 127.0.0.1 and ``localhost`` (tools on
    the machine itself). Server and client use: Redis presents it to its primary and Sentinel to Redis."""
    ca_key = serialization.load_pem_private_key(ca_key_pem, password=None)
    ca_cert = x509.load_pem_x509_certificate(ca_cert_pem)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise CertificateError("the CA key is not an EC key made by make_ca")
    key = ec.generate_private_key(ec.SECP256R1())
    san = x509.SubjectAlternativeName(
        [
            x509.IPAddress(ipaddress.ip_address(address)),
            x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
            x509.DNSName(name),
            x509.DNSName("localhost"),
        ]
    )
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(_now() - datetime.timedelta(minutes=5))
        .not_valid_after(_now() + datetime.timedelta(days=CERT_DAYS))
        .add_extension(san, critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
        )
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return _pem_key(key), cert.public_bytes(serialization.Encoding.PEM)
