"""The platform's node authority and each node's certificate, and the TLS both ends speak.

The hazard: a node door that took any TLS client would be an open relay into every compute of
the platform. Only a holder of a certificate this authority signed may connect; the authority's
key is in the store (readable by the platform alone) and never on a node's disk, and a node's own
key lives in memory only (handed to OpenSSL through a file deleted as soon as it is read).

The authority is a CA of its own (its name says "node", a random word tells two platforms'
apart), never the tenant-facing one of :mod:`pgplane.tls`: a client certificate from that one, or
from another platform's node authority, fails the handshake. A node's certificate names the node
(its common name); both ends check the other's is the node they expect.

The authority's signature is not enough on its own: whoever reads the store could sign with its
key. So both ends also check the other's certificate is one its node registered in the store
(``Node.door_certs``, by fingerprint), which only the node holding the key can have done, and a
door admits only nodes that are up. A node's certificate lasts a day and is issued again at
half-life, the new one registered before it is used; a node removed, or whose name another
process took, loses its door at the next connection.
"""

from __future__ import annotations

import datetime
import secrets
import ssl
import tempfile
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

AUTHORITY_VALID = datetime.timedelta(days=3650)
NODE_VALID = datetime.timedelta(days=1)
# A node's certificate this close to its end is issued again (and loaded) while the node runs.
RENEW_BEFORE = datetime.timedelta(hours=12)

_Key = ec.EllipticCurvePrivateKey


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _pem_key(key: _Key) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


@dataclass(frozen=True, slots=True)
class NodeCertificate:
    """A node's certificate and key, as PEM, and when the certificate ends."""

    node: str
    cert_pem: bytes
    key_pem: bytes
    not_after: datetime.datetime

    def due(self) -> bool:
        return self.not_after - _now() < RENEW_BEFORE

    @property
    def fingerprint(self) -> str:
        return fingerprint(x509.load_pem_x509_certificate(self.cert_pem))


def fingerprint(cert: x509.Certificate) -> str:
    """What the store registers of a node's certificate: its SHA-256, in hex."""
    return cert.fingerprint(hashes.SHA256()).hex()


@dataclass(frozen=True, slots=True)
class NodeAuthority:
    cert: x509.Certificate
    key: _Key

    @classmethod
    def create(cls) -> NodeAuthority:
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name(
            [
                x509.NameAttribute(NameOID.ORGANIZATION_NAME, "pgplane"),
                x509.NameAttribute(
                    NameOID.COMMON_NAME, f"pgplane node authority {secrets.token_hex(4)}"
                ),
            ]
        )
        now = _now()
        usage = x509.KeyUsage(
            digital_signature=False, content_commitment=False, key_encipherment=False,
            data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
            encipher_only=False, decipher_only=False,
        )  # fmt: skip
        cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + AUTHORITY_VALID)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(usage, critical=True)
            .add_extension(
                x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False
            )
            .sign(key, hashes.SHA256())
        )
        return cls(cert, key)

    @classmethod
    def from_pem(cls, cert_pem: str, key_pem: str) -> NodeAuthority:
        cert = x509.load_pem_x509_certificate(cert_pem.encode())
        key = serialization.load_pem_private_key(key_pem.encode(), password=None)
        if not isinstance(key, ec.EllipticCurvePrivateKey) or cert.public_key() != key.public_key():
            raise ValueError("the store's node authority: its key is not its certificate's")
        return cls(cert, key)

    def cert_pem(self) -> str:
        return self.cert.public_bytes(serialization.Encoding.PEM).decode()

    def key_pem(self) -> str:
        return _pem_key(self.key).decode()

    def issue(self, node: str) -> NodeCertificate:
        """A certificate for ``node``, to serve its door and to dial others' with."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = _now()
        not_after = min(now + NODE_VALID, self.cert.not_valid_after_utc)
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, node)]))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(not_after)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.ExtendedKeyUsage(
                    [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
                ),
                critical=False,
            )
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()),
                critical=False,
            )
            .sign(self.key, hashes.SHA256())
        )
        return NodeCertificate(
            node, cert.public_bytes(serialization.Encoding.PEM), _pem_key(key), not_after
        )


class NodeTls:
    """The TLS contexts of one node's channel: its door's (a client certificate of the authority
    required) and its dialling one (the other end's certificate checked against the authority).
    Both hold the node's certificate; :meth:`renew` replaces it in both, for new connections."""

    def __init__(self, authority: NodeAuthority, node: str) -> None:
        self.node = node
        self._authority = authority
        self.server = _context(ssl.PROTOCOL_TLS_SERVER, authority)
        self.client = _context(ssl.PROTOCOL_TLS_CLIENT, authority)
        self.certificate = authority.issue(node)
        self._load()

    def successor(self) -> NodeCertificate | None:
        """A new certificate for the node if its own nears its end (to register, then
        :meth:`use`); None while it has long to run."""
        return self._authority.issue(self.node) if self.certificate.due() else None

    def use(self, certificate: NodeCertificate) -> None:
        """Show ``certificate`` from now on, on new connections of both ends."""
        self.certificate = certificate
        self._load()

    def _load(self) -> None:
        # OpenSSL reads a key from a file only: one in a private directory, gone once read.
        with tempfile.TemporaryDirectory(prefix="pgplane-node-") as directory:
            pair = Path(directory) / "node.pem"
            pair.touch(mode=0o600)
            pair.write_bytes(self.certificate.key_pem + self.certificate.cert_pem)
            for context in (self.server, self.client):
                context.load_cert_chain(pair)


def _context(protocol: int, authority: NodeAuthority) -> ssl.SSLContext:
    context = ssl.SSLContext(protocol)
    context.minimum_version = ssl.TLSVersion.TLSv1_3  # both ends are ours
    context.verify_mode = ssl.CERT_REQUIRED
    # The node's name is checked on the certificate itself (peer_of), not as a host name:
    # nodes are dialled by address, and a node's name need not be one.
    context.check_hostname = False
    context.load_verify_locations(cadata=authority.cert_pem())
    return context


@dataclass(frozen=True, slots=True)
class Peer:
    """The other end of a verified connection: the node its certificate names (its common
    name) and the certificate's fingerprint."""

    node: str
    fingerprint: str

    def registered(self, certs: tuple[str, ...]) -> bool:
        return self.fingerprint in certs


def peer_of(ssl_object: ssl.SSLObject | ssl.SSLSocket | None) -> Peer | None:
    """The verified peer's node and certificate; None without a certificate naming one."""
    der = None if ssl_object is None else ssl_object.getpeercert(binary_form=True)
    if not der:
        return None
    cert = x509.load_der_x509_certificate(der)
    names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    return Peer(str(names[0].value), fingerprint(cert)) if names else None
