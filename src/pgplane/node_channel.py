"""``serve``'s side of the node channel (:mod:`pgplane.nodelink`): this node's certificate, its
way to the other nodes, and its door, wired to the proxy's sessions and the data reads.

Only on a PostgreSQL store: a SQLite store is one data directory's, so one node's, and a door
nobody may use is only one more way in. There the channel has no link, and starts nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from pgplane.config import Settings
from pgplane.connlimits import ConnectionGate
from pgplane.core.nodes import Node
from pgplane.engine.node import NodeLease
from pgplane.engine.project_data import NodeAnswers, ProjectData
from pgplane.errors import Unavailable
from pgplane.gateway import ComputeWaker
from pgplane.nodelink.authority import NodeTls
from pgplane.nodelink.client import NodeLink
from pgplane.proxy.doors.node import NodeDoor
from pgplane.proxy.forward import Forwarder
from pgplane.proxy.session import Sessions
from pgplane.services import nodes
from pgplane.store import Store

log = logging.getLogger(__name__)

_RENEW_SECONDS = 3600.0


class NodeChannel:
    def __init__(self, tls: NodeTls | None) -> None:
        self.tls = tls
        self.link = None if tls is None else NodeLink(tls)
        self._door: NodeDoor | None = None
        self._renewal: asyncio.Task[None] | None = None

    def forwarder(self) -> Forwarder | None:
        """The proxy's way to computes on other nodes."""
        return None if self.link is None else Forwarder(self.link)

    async def start(
        self,
        waker: ComputeWaker,
        sessions: Sessions,
        data: ProjectData,
        *,
        settings: Settings,
        store: Store,
        node: NodeLease,
        caps: ConnectionGate,
    ) -> None:
        """The node door listening (its connections capped as ``caps`` caps the proxy's), its
        address registered for the other nodes, and this node's certificate renewed as it nears
        its end."""
        if self.tls is None:
            return
        listen = settings.node_listen or settings.proxy_listen
        host = settings.node_advertise or listen
        if host in ("", "0.0.0.0", "::"):  # noqa: S104 - a wildcard is what is refused here
            await store.close()
            raise SystemExit(
                f"pgplane: the node door listens on {listen or 'every address'}: say which"
                " address other nodes dial it at with --node-advertise"
            )
        answers = NodeAnswers(data, waker.role_verifier)

        async def registry(name: str) -> Node | None:
            async with store.read() as tx:
                return await tx.get_node(name)

        door = NodeDoor(
            tls=self.tls,
            nodes=registry,
            computes=waker,
            sessions=sessions,
            answers=answers,
            gate=ConnectionGate(per_address=caps.per_address, total=caps.total),
        )
        try:
            bound = await door.start(listen, settings.node_port)
        except OSError as exc:
            await store.close()
            raise SystemExit(
                f"pgplane: the node door cannot listen on {listen}:{settings.node_port}"
                f" ({exc.strerror}); choose another port with --node-port"
            ) from None
        self._door = door
        port = bound[0][1]
        address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        await node.update_address(settings.proxy_port, address, [self.tls.certificate.fingerprint])
        log.info("pgplane node door listening on %s:%d (node certificates only)", listen, port)
        self._renewal = asyncio.create_task(self._renew(self.tls, node), name="node certificate")

    async def close(self) -> None:
        if self._renewal is not None:
            self._renewal.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._renewal
        if self._door is not None:
            await self._door.close()

    async def _renew(self, tls: NodeTls, node: NodeLease) -> None:
        while True:
            await asyncio.sleep(_RENEW_SECONDS)
            try:
                await renew(tls, node)
            except Unavailable as exc:
                log.warning("node %s: its node certificate not renewed: %s", tls.node, exc.message)
            except (OSError, ValueError, TypeError, nodes.NameTaken) as exc:
                log.warning("node %s: its node certificate not renewed: %s", tls.node, exc)


async def renew(tls: NodeTls, node: NodeLease) -> None:
    """Issue the node's certificate again near its end: registered first, then shown (a door
    that read the store before would refuse it otherwise), the one before still registered
    until the next look, for dials already in their handshake; then only the current one."""
    current = tls.certificate.fingerprint
    fresh = tls.successor()
    if fresh is not None:
        await node.register_certs([fresh.fingerprint, current])
        tls.use(fresh)
        log.info("node %s: its node certificate was renewed", tls.node)
    elif node.door_certs != (current,):
        await node.register_certs([current])


async def open_channel(store: Store, settings: Settings, name: str) -> NodeChannel:
    """This node's certificate, from the platform's node authority (made now when no node made
    it before), and its way to the others; a channel with neither on a SQLite store."""
    if settings.store is None:
        if settings.node_port or settings.node_listen or settings.node_advertise:
            await store.close()
            raise SystemExit(
                "pgplane: --node-listen, --node-port and --node-advertise place the node door,"
                " which a platform of several nodes has: give a PostgreSQL --store as well"
            )
        return NodeChannel(None)
    async with store.write() as tx:
        authority = await nodes.authority(tx)
    return NodeChannel(NodeTls(authority, name))
