"""The node door: other nodes' way to this node's computes and data, never a tenant's.

A listener of its own, apart from the proxy's doors, that speaks TLS 1.3 only and takes a
connection only from a client showing a certificate of the platform's node authority (checked in
the handshake: without one, or with one of the tenant-facing authority or of another platform,
the connection ends before a byte of it is read). The certificate must also be one a node that
is up registered in the store (its own, by fingerprint): one minted with the authority's key by
whoever read the store, or a node's after it was removed or its name taken by another process,
is cut there too. Unauthenticated connections are capped per
address and in all (as the proxy's connections are), and the handshake and the request have
one deadline; a node's connections are capped in all only (a node forwards many sessions from
one address).

Each connection carries one request (:mod:`pgplane.nodelink.messages`). A session (``Connect``)
is served as the proxy's own doors serve one after authentication, but from this node's reads:
the route (the client's address, as the asking node saw it, checked against the allow-list; the
role's secret; where the compute runs), the wake, the login, the pipe, the activity. Nothing is
relayed anywhere but to this node's own computes: a project placed elsewhere is answered
``NotHere``.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from collections.abc import Awaitable, Callable
from typing import Protocol

from pgplane.connlimits import ConnectionGate
from pgplane.core import clock
from pgplane.core.nodes import Node
from pgplane.errors import Unavailable
from pgplane.nodelink import messages
from pgplane.nodelink.authority import NodeTls, Peer, peer_of
from pgplane.proxy import scram, wire
from pgplane.proxy.listener import Listener
from pgplane.proxy.pipe import Closed, Side
from pgplane.proxy.seam import Computes, RouteError
from pgplane.proxy.session import POINT_IN_TIME_REFUSED, Sessions

log = logging.getLogger(__name__)

# A node's handshake and request come at once; a stranger's silence is cut short.
_HANDSHAKE_SECONDS = 10.0

Ask = messages.RoleVerifier | messages.HistoryBoundsAsk | messages.SchemaAsk


class Answers(Protocol):
    """What the platform answers another node's reads with (the entry point wires it)."""

    async def __call__(self, request: Ask) -> messages.Answer: ...


# A node as the store has it now (None: no such node).
Nodes = Callable[[str], Awaitable[Node | None]]


class NodeDoor:
    def __init__(
        self,
        *,
        tls: NodeTls,
        nodes: Nodes,
        computes: Computes,
        sessions: Sessions,
        answers: Answers,
        gate: ConnectionGate,
        handshake_seconds: float = _HANDSHAKE_SECONDS,
    ) -> None:
        self._tls = tls
        self._nodes_now = nodes
        self._computes = computes
        self._sessions = sessions
        self._answers = answers
        # Connections not yet proven a node's, per address (a burst of one node's forwarded
        # sessions is as many as one client address may hold on the proxy) and in all; and
        # every connection, proven or not, in all only: the nodes' addresses are few.
        self._handshakes = gate
        self._nodes = ConnectionGate(per_address=0, total=gate.total)
        self._handshake_seconds = handshake_seconds
        self._listener = Listener(self._serve)

    async def start(self, host: str, port: int) -> list[tuple[str, int]]:
        return await self._listener.start(host, port)

    async def close(self) -> None:
        await self._listener.close()

    async def _serve(self, sock: socket.socket, address: object) -> None:
        host = address[0] if isinstance(address, tuple) and address else ""
        handshake = self._handshakes.admit(str(host) or None)
        place = self._nodes.admit(None) if handshake is not None else None
        if handshake is None or place is None:
            if handshake is not None:
                handshake.release()
            sock.close()
            return
        try:
            try:
                side, peer, request = await self._handshake(sock)
            finally:
                handshake.release()
            if side is None or request is None:
                return
            try:
                await self._dispatch(side, peer, request)
            except Exception:
                log.exception("node door: a request of node %s failed", peer)
                side.close()
        finally:
            place.release()

    async def _handshake(
        self, sock: socket.socket
    ) -> tuple[Side | None, str, messages.Request | None]:
        """TLS with a node certificate, then the connection's request, within the deadline."""
        loop = asyncio.get_running_loop()
        made: list[Side] = []

        def side() -> Side:
            made.append(Side())
            return made[-1]

        try:
            async with asyncio.timeout(self._handshake_seconds):
                await loop.connect_accepted_socket(side, sock, ssl=self._tls.server)
        except (OSError, TimeoutError, ssl.SSLError):
            # No certificate of the node authority (or none at all, or silence): nothing read.
            sock.close()
            return None, "", None
        except BaseException:
            sock.close()
            raise
        client = made[0]
        found = peer_of(client.transport.get_extra_info("ssl_object"))
        peer = "?" if found is None else found.node
        if found is None or not await self._registered(found):
            client.close()
            return None, peer, None
        try:
            async with asyncio.timeout(self._handshake_seconds):
                header = await client.read_exactly(messages.HEADER)
                size = messages.length(header, limit=messages.MAX_REQUEST)
                request = messages.request(await client.read_exactly(size))
        except (Closed, ConnectionError, TimeoutError, messages.MessageError) as exc:
            log.warning("node door: node %s sent no request: %s", peer, exc or "closed")
            client.close()
            return None, peer, None
        return client, peer, request

    async def _registered(self, peer: Peer) -> bool:
        """Whether ``peer`` shows a certificate its node registered, and that node is up."""
        try:
            node = await self._nodes_now(peer.node)
        except Unavailable as exc:
            log.warning("node door: node %s not checked (%s): refused", peer.node, exc.message)
            return False
        if node is None:
            why = "no such node"
        elif not node.up(clock.now_us()):
            why = "the node is down"
        elif not peer.registered(node.door_certs):
            why = "a certificate the node did not register"
        else:
            return True
        log.warning("node door: a certificate naming node %s refused: %s", peer.node, why)
        return False

    async def _dispatch(self, side: Side, peer: str, request: messages.Request) -> None:
        if isinstance(request, messages.Connect):
            await self._connect(side, request)
        elif isinstance(request, messages.Cancel):
            side.close()
            await self._sessions.cancel_forwarded(request.pid, request.key)
        else:
            await self._answer(side, await self._answers(request))

    async def _connect(self, side: Side, request: messages.Connect) -> None:
        """A session another node authenticated: routed, woken and logged in here, then piped."""
        endpoint_id, user = request.endpoint_id, request.params.get("user", "")
        startup = wire.Startup(request.version, dict(request.params))
        compute: Side | None = None
        answer: messages.Answer
        if wire.asks_point_in_time(startup):  # the asking node refused it too
            await self._answer(
                side, messages.Refused(wire.FEATURE_NOT_SUPPORTED, POINT_IN_TIME_REFUSED)
            )
            return
        try:
            # This node's own reads: the allow-list against the client's address (not the
            # asking node's), the role's secret (the compute logs in with it, not with anything
            # the asking node sent), and where the compute runs.
            route = await self._computes.route(endpoint_id, user, client=request.client)
            if route.target is not None and route.target.via is not None:
                answer = messages.NotHere(
                    f"endpoint {endpoint_id} is on node {route.target.via.node}"
                )
            else:
                compute, target, reply = await self._sessions.open(endpoint_id, startup, route)
                connected = messages.frame(messages.Connected(reply))
                try:
                    await self._sessions.pipe(
                        side,
                        compute,
                        cancel_to=(target, route.allowed),
                        endpoint_id=endpoint_id,
                        reply=reply,
                        first=connected,
                    )
                finally:
                    side.close()
                return
        except RouteError as exc:
            answer = messages.Refused(exc.code, exc.message, exc.severity)
        except scram.ScramError as exc:
            answer = messages.Refused(wire.INVALID_PASSWORD, str(exc))
        finally:
            if compute is not None:
                compute.close()
        await self._answer(side, answer)

    async def _answer(self, side: Side, answer: messages.Answer) -> None:
        side.write(messages.frame(answer))
        await side.close_after_reply()
