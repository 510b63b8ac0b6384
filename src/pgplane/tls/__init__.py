"""The proxy's TLS: the operator's certificate, or one the platform's own authority signs.

Without ``--tls-cert``/``--tls-key`` the platform keeps, in ``<data-dir>/tls`` (0700), its
certificate authority (``ca.crt``, which clients trust; ``ca.key``, 0600) and the proxy's
certificate signed by it (:mod:`pgplane.tls.authority`), renewed at start when the names change
or its end nears. On a PostgreSQL store (several nodes) the authority is the platform's, one for
every node, kept in the store (:mod:`pgplane.tls.shared`). Names under a one-label host get a
certificate each (:mod:`pgplane.tls.by_name`).
The operator's own pair is used as it is: nothing is made, renewed or signed.

Clients' SCRAM channel binding (``tls-server-end-point``) is the hash of the certificate the
client was shown, which the proxy checks when it authenticates them (:mod:`pgplane.proxy.scram`).
"""

from __future__ import annotations

import contextlib
import logging
import ssl
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization

from pgplane.tls.authority import Authority, ensure_authority, ensure_leaf
from pgplane.tls.by_name import ByName

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class CertPair:
    cert: Path
    key: Path


@dataclass(frozen=True, slots=True)
class ProxyTLS:
    """The proxy's certificate, and the authority that signed it (None: the operator's own)."""

    pair: CertPair
    authority: Authority | None = None
    host: str = "localhost"


def ca_certificate(directory: Path) -> Path:
    """Where the platform's authority certificate is (``<data-dir>/tls/ca.crt``)."""
    return directory / "ca.crt"


def ensure_certificate(directory: Path, host: str) -> ProxyTLS:
    """The platform's authority and the proxy's certificate for ``host`` in ``directory``, made
    or renewed as needed (a self-signed certificate of an older install is replaced)."""
    return signed_certificate(ensure_authority(directory, host), host)


def signed_certificate(authority: Authority, host: str) -> ProxyTLS:
    """The proxy's certificate for ``host``, beside the authority's certificate, issued by it
    anew when the one there is not its own (another authority's, before a shared one), names
    other names or nears its end."""
    directory = authority.cert_path.parent
    pair = CertPair(directory / "proxy.crt", directory / "proxy.key")
    ensure_leaf(authority, pair.cert, pair.key, host)
    return ProxyTLS(pair, authority, host)


def server_context(tls: ProxyTLS, alpn_protocols: tuple[str, ...] = ()) -> ssl.SSLContext:
    """What the proxy offers clients: TLS 1.2+, and the SNI name kept for routing (with a
    certificate of its own when the name needs one).

    The SNI callback leaves on each connection's SSLObject ``pgplane_sni`` (the name asked for)
    and, when it chose a certificate made for that name, ``pgplane_cert_hash`` (its channel
    binding data); the proxy reads both."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(tls.pair.cert, tls.pair.key)
    if alpn_protocols:
        ctx.set_alpn_protocols(list(alpn_protocols))
    by_name = None
    if tls.authority is not None:
        by_name = ByName(tls.authority, tls.pair.key, tls.host, tls.pair.key.parent, alpn_protocols)

    def on_sni(ssl_object: ssl.SSLObject, server_name: str | None, _: ssl.SSLContext) -> None:
        # The server side of an SSLObject does not keep the name; routing needs it after the
        # handshake. SSLObject instances take attributes.
        with contextlib.suppress(AttributeError):
            ssl_object.pgplane_sni = server_name  # type: ignore[attr-defined]
        name = (server_name or "").lower().rstrip(".")
        if by_name is not None and by_name.wants(name):
            try:
                made = by_name.get(name, ctx)
            except (OSError, ssl.SSLError, ValueError):
                # The client is shown the proxy's certificate, which it may not take for this name.
                log.exception("no certificate could be made for %s", name)
                return
            ssl_object.context = made.context
            with contextlib.suppress(AttributeError):
                ssl_object.pgplane_cert_hash = made.cert_hash  # type: ignore[attr-defined]

    ctx.sni_callback = on_sni
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
