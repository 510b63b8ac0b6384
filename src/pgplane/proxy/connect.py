"""The proxy's way to a compute, one for every door: dial it, log in as the role, retry
through a wake.

A compute that answers "starting up" / "shutting down", ends the login because it is going down,
or cannot be reached at all, is woken and tried again: a client arriving while its compute
suspends waits for the start that follows. Only called for a client that has proven its role's
password (the doors authenticate first): a wake is never at a stranger's request.
"""

from __future__ import annotations

import asyncio
import os
import struct
from pathlib import Path
from socket import SO_PEERCRED, SOL_SOCKET

from pgplane.proxy import scram, wire
from pgplane.proxy.forward import Forwarder, Moved
from pgplane.proxy.login import NotReady, log_in
from pgplane.proxy.pipe import Closed, Side
from pgplane.proxy.seam import Computes, Route, RouteError, Target

CONNECT_ATTEMPTS = 5


class Connector:
    def __init__(self, computes: Computes, forwarder: Forwarder | None = None) -> None:
        self._computes = computes
        self._forwarder = forwarder

    async def open(
        self, endpoint_id: str, startup: wire.Startup, route: Route
    ) -> tuple[Side, Target, bytes]:
        """Connect to the endpoint's compute and start the session; retry through a wake.

        Returns the compute connection and the compute's replies from AuthenticationOk to
        ReadyForQuery (or its refusal), for the client. A compute on another node is reached
        through that node (:mod:`pgplane.proxy.forward`), which wakes it itself; a project that
        moved meanwhile is routed once more.
        """
        for _ in range(2):
            if route.secret is None:  # authentication refused it already; never wake for it
                raise scram.ScramError("password authentication failed")
            target = route.target
            if target is None or target.via is None:
                return await self._open_here(endpoint_id, startup, route)
            if self._forwarder is None:
                raise RouteError(
                    wire.CONNECTION_FAILURE,
                    f"endpoint {endpoint_id} is served by node {target.via.node}: connect there",
                )
            try:
                compute, reply = await self._forwarder.open(target, startup, client=route.client)
            except Moved:
                user = startup.params["user"]
                route = await self._computes.route(endpoint_id, user, client=route.client)
                continue
            return compute, target, reply
        raise RouteError(
            wire.CONNECTION_FAILURE, f"endpoint {endpoint_id} is moving between nodes; retry"
        )

    async def _open_here(
        self, endpoint_id: str, startup: wire.Startup, route: Route
    ) -> tuple[Side, Target, bytes]:
        assert route.secret is not None  # noqa: S101 - checked by open
        known, force = route.target, False
        last_problem = ""
        for _ in range(CONNECT_ATTEMPTS):
            target = known or await self._computes.wake(endpoint_id, force=force)
            # The store's word is tried once; after a failed connection only a start will do.
            known, force = None, True
            try:
                compute = await self._dial(target)
            except (OSError, Closed) as exc:
                last_problem = f"compute unreachable: {exc}"
                continue
            try:
                reply = await log_in(compute, startup, route.secret)
            except NotReady as exc:
                compute.close()
                last_problem = str(exc)
                continue
            except (Closed, ConnectionError):
                compute.close()
                last_problem = "compute closed the connection"
                continue
            except BaseException:
                compute.close()
                raise
            return compute, target, reply
        raise RouteError(
            wire.CONNECTION_FAILURE, f"could not connect to endpoint {endpoint_id}: {last_problem}"
        )

    async def cancel(self, target: Target, pid: int, key: bytes) -> None:
        """Send a CancelRequest to the compute of ``target`` (through its node, if another)."""
        if target.via is not None:
            if self._forwarder is not None:
                await self._forwarder.cancel(target, pid, key)
            return
        compute = await self._dial(target)
        compute.write(wire.cancel_request(pid, key))
        compute.close()

    async def _dial(self, target: Target) -> Side:
        loop = asyncio.get_running_loop()
        if target.unix_socket is not None:
            transport, side = await loop.create_unix_connection(Side, str(target.unix_socket))
            if not _served_by_its_owner(transport, target.unix_socket):
                transport.close()
                raise ConnectionError("the compute's socket is not its own postmaster's")
        else:
            _, side = await loop.create_connection(Side, target.host, target.port)
        return side


def _served_by_its_owner(transport: asyncio.BaseTransport, socket_path: Path) -> bool:
    """Whether the process listening at ``socket_path`` runs as the owner of its directory.

    The directory is the project's user's (the platform made it, in a directory of root's, so
    its owner is known); the socket in it is whatever that user put there. A tenant holding its
    compute's OS user could make it a link to another account's socket: the kernel tells who
    listens at the other end (SO_PEERCRED), and another account's postmaster is another user.
    """
    sock = transport.get_extra_info("socket")
    if sock is None:
        return False
    try:
        _pid, uid, _gid = struct.unpack("3i", sock.getsockopt(SOL_SOCKET, SO_PEERCRED, 12))
        owner: int = os.stat(socket_path.parent).st_uid
    except OSError:
        return False
    return bool(uid == owner)
