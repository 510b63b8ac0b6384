"""The tenant-facing authority of a platform of several nodes: one for all, kept in the store.

Behind one address (a load balancer) a client is handed to any node, and a client that trusts one
node's own authority would be refused by the next, whose authority differs. On a PostgreSQL store
every node serves certificates of the platform's authority, which the store keeps
(:mod:`pgplane.services.proxy_authority` decides which one it is), and keeps of it in its data
directory the certificate only: ``<data-dir>/tls/ca.crt`` is the same file on every node, and
``pgplane tls ca-cert`` prints it on any. The key's one home is the store, as the node
authority's is: readable by the platform alone, with no copy on a node's disk to leak, or to be
taken for the platform's once the platform's was replaced.
"""

from __future__ import annotations

from pathlib import Path

from cryptography import x509

from pgplane.compute.local.files import write_atomic
from pgplane.tls.authority import Authority, load_pair


def local(directory: Path) -> Authority | None:
    """The data directory's own authority (its single-node days'), when both halves are there."""
    found = load_pair(directory / "ca.crt", directory / "ca.key")
    return None if found is None else Authority(*found, directory / "ca.crt")


def trusted(directory: Path) -> x509.Certificate | None:
    """The certificate this node gave clients to trust until now, whichever authority's."""
    try:
        return x509.load_pem_x509_certificate((directory / "ca.crt").read_bytes())
    except (OSError, ValueError):
        return None


def install(directory: Path, cert_pem: str, key_pem: str) -> Authority:
    """The platform's authority, its certificate where clients find it, and the data
    directory's own key gone (the store has the platform's)."""
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    directory.chmod(0o700)
    authority = Authority.from_pem(cert_pem, key_pem, directory / "ca.crt")
    if trusted(directory) != authority.cert:
        write_atomic(authority.cert_path, cert_pem.encode(), 0o644)
    # After the certificate: a crash between the two leaves a key that is not the certificate's,
    # which the next start does not take for an authority of this directory.
    (directory / "ca.key").unlink(missing_ok=True)
    return authority
