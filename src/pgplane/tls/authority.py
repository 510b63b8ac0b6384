"""The platform's own certificate authority, which signs the proxy's certificates.

Clients that verify the server (``sslmode=verify-full``; node-postgres, which reads
``sslmode=require`` that way) need a certificate they trust for the name they dial. A
self-signed proxy certificate is trusted by nothing, and a new one on every reinstall would have
to be trusted again; so the platform keeps one authority, made on first start, whose
certificate clients trust once (``sslrootcert=``, ``NODE_EXTRA_CA_CERTS``, a system store).

Its key never leaves the data directory (0600 in a 0700 directory); on a platform of several
nodes it is the platform's, kept in the store instead (:mod:`pgplane.tls.shared`). The authority
is name-constrained to the names the proxy serves (the proxy host, ``localhost`` and loopback
addresses): a trust store that takes it trusts it for nothing else, should its key leak.
"""

from __future__ import annotations

import datetime
import ipaddress
import logging
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from pgplane.compute.local.files import write_atomic

log = logging.getLogger(__name__)

CA_VALID = datetime.timedelta(days=3650)
# Apple's limit for a TLS server certificate under a user-trusted authority is 825 days.
LEAF_VALID = datetime.timedelta(days=825)
# A certificate this close to its end is replaced at the next start.
RENEW_BEFORE = datetime.timedelta(days=60)
_CA_RENEW_BEFORE = datetime.timedelta(days=365)
_LOOPBACK = ("127.0.0.1", "::1")

Name = x509.DNSName | x509.IPAddress
_Key = ec.EllipticCurvePrivateKey


def _ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def proxy_names(host: str) -> list[Name]:
    """What the proxy's certificate names: ``localhost`` and ``*.localhost``, the proxy host and
    ``*.<host>`` (``ep-….<host>``, ``api.<host>``), and the loopback addresses."""
    names: list[Name] = [x509.DNSName("localhost"), x509.DNSName("*.localhost")]
    host = host.lower().rstrip(".")
    address = _ip(host)
    if address is not None:
        names.append(x509.IPAddress(address))
    elif host and host != "localhost":
        names += [x509.DNSName(host), x509.DNSName(f"*.{host}")]
    names += [x509.IPAddress(ipaddress.ip_address(a)) for a in _LOOPBACK]
    return list(dict.fromkeys(names))


def _constraints(host: str) -> list[x509.GeneralName]:
    """The subtrees the authority may sign for: a DNS subtree covers the name and every name
    under it (RFC 5280 4.2.1.10)."""
    subtrees: list[x509.GeneralName] = [x509.DNSName("localhost")]
    host = host.lower().rstrip(".")
    address = _ip(host)
    if address is not None:
        subtrees.append(x509.IPAddress(ipaddress.ip_network(address)))
    elif host and host != "localhost":
        subtrees.append(x509.DNSName(host))
    subtrees += [x509.IPAddress(ipaddress.ip_network("127.0.0.0/8"))]
    subtrees += [x509.IPAddress(ipaddress.ip_network("::1/128"))]
    return subtrees


def _covers(subtree: x509.GeneralName, name: Name) -> bool:
    if isinstance(subtree, x509.DNSName) and isinstance(name, x509.DNSName):
        base, value = subtree.value.lower(), name.value.lower()
        return value == base or value.endswith(f".{base}")
    if isinstance(subtree, x509.IPAddress) and isinstance(name, x509.IPAddress):
        network, address = subtree.value, name.value
        return isinstance(network, ipaddress.IPv4Network | ipaddress.IPv6Network) and (
            address in network
        )
    return False


def _pem_key(key: _Key) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def load_pair(cert_path: Path, key_path: Path) -> tuple[x509.Certificate, _Key] | None:
    """The pair at these paths, if both are there and belong together."""
    try:
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    except (OSError, ValueError):
        return None
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        return None
    if cert.public_key() != key.public_key():
        return None  # a crash between the two writes: make both anew
    return cert, key


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _fresh(cert: x509.Certificate, margin: datetime.timedelta) -> bool:
    return cert.not_valid_after_utc - _now() > margin


@dataclass(frozen=True, slots=True)
class Authority:
    cert: x509.Certificate
    key: _Key
    cert_path: Path  # the certificate clients trust

    def issue(self, names: Iterable[Name], key: _Key) -> x509.Certificate:
        """A server certificate for ``names`` (the first is its common name) on ``key``."""
        names = list(names)
        now = _now()
        return (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, str(names[0].value))]))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(min(now + LEAF_VALID, self.cert.not_valid_after_utc))
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()),
                critical=False,
            )
            .sign(self.key, hashes.SHA256())
        )

    def signed(self, cert: x509.Certificate) -> bool:
        """Whether ``cert`` is this authority's."""
        if cert.issuer != self.cert.subject:
            return False
        try:
            cert.verify_directly_issued_by(self.cert)
        except (ValueError, TypeError, InvalidSignature):
            return False
        return True

    @classmethod
    def from_pem(cls, cert_pem: str, key_pem: str, cert_path: Path) -> Authority:
        cert = x509.load_pem_x509_certificate(cert_pem.encode())
        key = serialization.load_pem_private_key(key_pem.encode(), password=None)
        if not isinstance(key, ec.EllipticCurvePrivateKey) or cert.public_key() != key.public_key():
            raise ValueError("the certificate authority's key is not its certificate's")
        return cls(cert, key, cert_path)

    def pem(self) -> tuple[str, str]:
        """The certificate and the key, as PEM."""
        return self.cert.public_bytes(serialization.Encoding.PEM).decode(), _pem_key(
            self.key
        ).decode()

    def subtrees(self) -> str:
        """The names it may sign for, as an operator reads them."""
        try:
            ext = self.cert.extensions.get_extension_for_class(x509.NameConstraints).value
        except x509.ExtensionNotFound:
            return "any name"
        return ", ".join(str(s.value) for s in ext.permitted_subtrees or [])

    def permits_host(self, host: str) -> bool:
        """Whether it may sign the proxy's certificate for ``host`` (:func:`proxy_names`)."""
        return self.permits(proxy_names(host))

    def permits(self, names: Iterable[Name]) -> bool:
        """Whether the authority's name constraints take every name of ``names``."""
        try:
            ext = self.cert.extensions.get_extension_for_class(x509.NameConstraints).value
        except x509.ExtensionNotFound:
            return True
        subtrees = ext.permitted_subtrees or []
        return all(any(_covers(s, n) for s in subtrees) for n in names)


def make_authority(host: str, cert_path: Path) -> Authority:
    """A new authority constrained to the names of ``host`` (:func:`proxy_names`), in memory;
    ``cert_path`` is where clients will find its certificate."""
    key = ec.generate_private_key(ec.SECP256R1())
    # A word of its own in the name, so two installs' authorities in one trust store are told
    # apart by name as well as by key.
    subject = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "pgplane"),
            x509.NameAttribute(NameOID.COMMON_NAME, f"pgplane local CA {secrets.token_hex(4)}"),
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
        .not_valid_after(now + CA_VALID)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(usage, critical=True)
        .add_extension(
            x509.NameConstraints(permitted_subtrees=_constraints(host), excluded_subtrees=None),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return Authority(cert, key, cert_path)


def _create(directory: Path, host: str) -> Authority:
    authority = make_authority(host, directory / "ca.crt")
    cert_pem, key_pem = authority.pem()
    # The key first, so a crash leaves no certificate without its key; both written atomically.
    write_atomic(directory / "ca.key", key_pem.encode())
    write_atomic(directory / "ca.crt", cert_pem.encode(), 0o644)
    return authority


def replacement_reason(authority: Authority, host: str) -> str | None:
    """Why ``authority`` cannot serve the proxy host ``host`` (None: it can)."""
    if not _fresh(authority.cert, _CA_RENEW_BEFORE):
        return "it nears its end"
    if not authority.permits_host(host):
        return f"it is not valid for the proxy host {host}"
    return None


def ensure_authority(directory: Path, host: str) -> Authority:
    """The authority in ``directory`` (``ca.crt``, ``ca.key``), made when missing, near its end,
    or constrained to names that no longer include ``host``."""
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    directory.chmod(0o700)
    found = load_pair(directory / "ca.crt", directory / "ca.key")
    if found is not None:
        authority = Authority(*found, directory / "ca.crt")
        reason = replacement_reason(authority, host)
        if reason is None:
            return authority
        log.warning(
            "the platform's certificate authority is replaced (%s): clients that trusted the old"
            " one must trust %s instead (pgplane tls ca-cert prints it)",
            reason,
            authority.cert_path,
        )
    authority = _create(directory, host)
    log.info(
        "certificate authority created: clients trust %s (sslrootcert=, NODE_EXTRA_CA_CERTS)",
        authority.cert_path,
    )
    return authority


def ensure_leaf(authority: Authority, cert_path: Path, key_path: Path, host: str) -> bool:
    """The proxy's certificate at these paths, signed by ``authority`` for :func:`proxy_names`;
    issued anew when missing, not the authority's (a self-signed one from before), naming other
    names, or near its end. Returns whether it was issued."""
    names = proxy_names(host)
    found = load_pair(cert_path, key_path)
    if found is not None:
        cert, key = found
        try:
            had = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        except x509.ExtensionNotFound:
            had = x509.SubjectAlternativeName([])
        if authority.signed(cert) and set(had) == set(names) and _fresh(cert, RENEW_BEFORE):
            return False
    key = ec.generate_private_key(ec.SECP256R1())
    cert = authority.issue(names, key)
    write_atomic(key_path, _pem_key(key))
    write_atomic(cert_path, cert.public_bytes(serialization.Encoding.PEM), 0o644)
    return True
