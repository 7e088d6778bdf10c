"""A throwaway certificate authority and a server certificate it signed, for TLS tests on 127.0.0.1."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CERT_LIFETIME = datetime.timedelta(days=1)
CLOCK_SKEW = datetime.timedelta(minutes=5)
LOOPBACK_IP = "127.0.0.1"
LOOPBACK_NAME = "localhost"
PRIVATE_FILE_MODE = 0o600


@dataclass(frozen=True)
class CertificateFiles:
    ca_cert: Path
    server_cert: Path
    server_key: Path


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _builder(subject: str, issuer: str, public_key: ec.EllipticCurvePublicKey) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(_name(issuer))
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW)
        .not_valid_after(now + CERT_LIFETIME)
    )


def _write_pem_cert(path: Path, cert: x509.Certificate) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def _write_pem_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    path.chmod(PRIVATE_FILE_MODE)


def make_test_certificates(directory: Path) -> CertificateFiles:
    """A CA and a certificate for 127.0.0.1 and localhost signed by it, as PEM files in `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = (
        _builder("draftgen test CA", "draftgen test CA", ca_key.public_key())
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
        .sign(ca_key, hashes.SHA256())
    )
    server_key = ec.generate_private_key(ec.SECP256R1())
    server_cert = (
        _builder(LOOPBACK_NAME, "draftgen test CA", server_key.public_key())
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName(LOOPBACK_NAME), x509.IPAddress(ipaddress.ip_address(LOOPBACK_IP))]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    certificates = CertificateFiles(
        ca_cert=directory / "ca.crt", server_cert=directory / "redis.crt", server_key=directory / "redis.key"
    )
    _write_pem_cert(certificates.ca_cert, ca_cert)
    _write_pem_cert(certificates.server_cert, server_cert)
    _write_pem_key(certificates.server_key, server_key)
    return certificates
