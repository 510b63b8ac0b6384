"""The tenant-facing certificate authority of a platform of several nodes: which one every node
serves certificates of, decided in the store, in one write transaction.

- **None in the store yet** (the platform's first node that needs it): the node's own authority
  from its single-node days, when it is still fit for its proxy host, becomes the platform's, so
  the clients that trust it already go on verifying this node and trust every other node as
  well; the common way to several nodes is one platform that grows (``pgplane store copy``, then
  more nodes). Otherwise a new one is made. Writers are serialized, so nodes starting together
  agree: the second finds the first's.
- **The store's one serves this node's proxy host**: taken, whatever the node had before (the
  entry point tells the operator when the certificate clients trust there changes).
- **It does not** (it nears its end, or this node's ``--proxy-host`` is outside its name
  constraints): a node may replace it only while no other node is up, since every node up serves
  certificates of the one there is and a client that trusts the new one would be refused by
  them. While another is up, a node outside the names is refused at start, naming them; one
  whose authority nears its end keeps it (it is still valid) and says so.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from pgplane.store import Tx
from pgplane.tls.authority import Authority, make_authority, replacement_reason

log = logging.getLogger(__name__)


class NotCovered(Exception):
    """The platform's authority is not valid for this node's proxy host, and other nodes serve
    it."""


class How(StrEnum):
    STORED = "stored"  # the store's, as it was
    ADOPTED = "adopted"  # this node's own, now the platform's
    MADE = "made"  # new: the store had none
    REPLACED = "replaced"  # new, in place of the store's


@dataclass(frozen=True, slots=True)
class Chosen:
    cert: str
    key: str
    how: How
    reason: str = ""  # why the store's was replaced or is kept though due, or the own not taken


async def choose(
    tx: Tx, *, host: str, node: str, local: Authority | None, now: int, cert_path: Path
) -> Chosen:
    """The authority node ``node`` (proxy host ``host``; ``local``: its data directory's own)
    serves certificates of, recorded in the store when new (raises NotCovered)."""
    found = await tx.get_proxy_authority()
    if found is None:
        reason = None if local is None else replacement_reason(local, host)
        if local is not None and reason is None:
            return await _put(tx, local, How.ADOPTED, now)
        made = make_authority(host, cert_path)
        return await _put(tx, made, How.MADE, now, f"this node's own: {reason}" if reason else "")
    current = Authority.from_pem(*found, cert_path)
    reason = replacement_reason(current, host)
    if reason is None:
        return Chosen(*found, How.STORED)
    up = sorted(
        load.node.name
        for load in await tx.node_loads()
        if load.node.name != node and load.node.up(now)
    )
    if not up:
        return await _put(tx, make_authority(host, cert_path), How.REPLACED, now, reason)
    if current.permits_host(host):
        return Chosen(*found, How.STORED, f"{reason}: a node that starts alone replaces it")
    raise NotCovered(
        f"the platform's certificate authority (in the store, one for every node) is valid for"
        f" {current.subtrees()} only, not for this node's proxy host {host}, and node(s)"
        f" {', '.join(up)}, up, serve certificates of it: give this node the --proxy-host the"
        f" others have (the name clients dial, a load balancer's), or a certificate of its own"
        f" with --tls-cert/--tls-key; or stop the other nodes, and the first to start again"
        f" makes the platform an authority for its proxy host"
    )


async def _put(tx: Tx, authority: Authority, how: How, now: int, reason: str = "") -> Chosen:
    cert, key = authority.pem()
    await tx.put_proxy_authority(cert=cert, key=key, now=now)
    return Chosen(cert, key, how, reason)
