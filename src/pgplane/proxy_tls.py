"""``serve``'s side of the proxy's TLS (:mod:`pgplane.tls`): the operator's own pair, the data
directory's authority (a SQLite store: one node), or the platform's, kept in the store: shared by
every node of a PostgreSQL store, and copied to the object store with a SQLite store's
(:mod:`pgplane.tls.shared`), with what changed for clients said in the log."""

from __future__ import annotations

import logging

from pgplane.config import Settings
from pgplane.core import clock
from pgplane.services import proxy_authority
from pgplane.services.proxy_authority import How
from pgplane.store import Store
from pgplane.tls import CertPair, ProxyTLS, ensure_certificate, shared, signed_certificate

log = logging.getLogger("pgplane")


async def proxy_certificate(settings: Settings, store: Store, node: str) -> ProxyTLS:
    """The proxy's certificate as this node serves it (raises
    :class:`~pgplane.services.proxy_authority.NotCovered` when the platform's authority cannot
    serve its proxy host). Run once the node is registered: on a store of several nodes,
    whether it may replace the platform's authority depends on which other nodes are up, and
    nodes starting together then see each other whatever their order."""
    if settings.tls_cert is not None and settings.tls_key is not None:
        return ProxyTLS(CertPair(settings.tls_cert, settings.tls_key))
    host = settings.proxy_host
    if settings.store is None and settings.object_store is None:
        return ensure_certificate(settings.tls_dir, host)
    # In the store: every node's, and with an object store, the copy of a SQLite store carries
    # it, so a recovered platform serves certificates of the same authority its clients trust.
    directory = settings.tls_dir
    cert_path = directory / "ca.crt"
    before = shared.trusted(directory)
    async with store.write() as tx:
        chosen = await proxy_authority.choose(
            tx,
            host=host,
            node=node,
            local=shared.local(directory),
            now=clock.now_us(),
            cert_path=cert_path,
        )
    authority = shared.install(directory, chosen.cert, chosen.key)
    if chosen.how is How.ADOPTED:
        log.info(
            "this node's certificate authority (%s) is now the platform's, kept in the store:"
            " clients that trust it verify every node",
            cert_path,
        )
    elif chosen.how is How.MADE:
        log.info(
            "the platform's certificate authority was made, kept in the store: clients trust %s"
            " (the same on every node; pgplane tls ca-cert prints it)",
            cert_path,
        )
    elif chosen.how is How.REPLACED:
        log.warning(
            "the platform's certificate authority is replaced (%s), for every node: clients that"
            " trusted the old one must trust %s instead (pgplane tls ca-cert prints it)",
            chosen.reason,
            cert_path,
        )
    elif chosen.reason:
        log.warning("the platform's certificate authority is kept though %s", chosen.reason)
    if before is not None and before != authority.cert and chosen.how is not How.REPLACED:
        log.warning(
            "this node's certificate authority of before is replaced by the platform's, one for"
            " every node%s: clients that trusted the old one must trust %s instead (pgplane tls"
            " ca-cert prints it)",
            f" ({chosen.reason})" if chosen.how is How.MADE and chosen.reason else "",
            cert_path,
        )
    return signed_certificate(authority, host)
