"""The proxy's certificate: from configuration, or generated once and kept in the data directory.

Clients' SCRAM channel binding (``tls-server-end-point``) is the hash of this certificate, which
the proxy checks when it authenticates them (see :mod:`pgplane.proxy.scram`).
"""

from __future__ import annotations

import datetime
import ipaddress
import ssl
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from pgplane.compute.local.files import write_atomic

_VALID_DAYS = 3650


@dataclass(frozen=True, slots=True)
class CertPair:
    cert: Path
    key: Path


def ensure_certificate(directory: Path, host: str) -> CertPair:
    """The generated pair in ``directory``, created on first use (self-signed, ECDSA P-256).

    Valid for ``host``, ``*.host`` (endpoint names), ``localhost`` and the loopback addresses.
    Clients connect with ``sslmode=require``, which encrypts without verifying; an operator who
    wants verification configures a certificate of their own.
    """
    pair = CertPair(directory / "proxy.crt", directory / "proxy.key")
    if pair.cert.is_file() and pair.key.is_file():
        return pair
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = [x509.DNSName("localhost")]
    try:
        names.append(x509.IPAddress(ipaddress.ip_address(host)))
    except ValueError:
        names += [x509.DNSName(host), x509.DNSName(f"*.{host}")]
    names += [x509.IPAddress(ipaddress.ip_address(a)) for a in ("127.0.0.1", "::1")]
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host or "pgplane")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=_VALID_DAYS))
        .add_extension(x509.SubjectAlternativeName(list(dict.fromkeys(names))), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    # The key first, so a crash leaves no certificate without its key; both written atomically.
    write_atomic(pair.key, key_pem)
    write_atomic(pair.cert, cert.public_bytes(serialization.Encoding.PEM))
    return pair


def server_context(pair: CertPair) -> ssl.SSLContext:
    """What the proxy offers clients: TLS 1.2+, and the SNI name kept for routing."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(pair.cert, pair.key)
    return ctx


def certificate_hash(pair: CertPair) -> bytes:
    """tls-server-end-point channel binding data: SHA-256 of the DER certificate (RFC 5929;
    SHA-256 also for certificates signed with SHA-1 or MD5)."""
    cert = x509.load_pem_x509_certificate(pair.cert.read_bytes())
    algorithm = cert.signature_hash_algorithm
    if not isinstance(algorithm, hashes.SHA384 | hashes.SHA512):
        algorithm = hashes.SHA256()
    digest = hashes.Hash(algorithm)
    digest.update(cert.public_bytes(serialization.Encoding.DER))
    return digest.finalize()
