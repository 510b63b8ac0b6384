"""Forwarding between two proxies in one process, over a real node door (mutual TLS) to a
scripted compute: the owning node's answers as the client sees them, and a project that moved
between the asking node's route and the owning node's (routed once more). End to end, with real
nodes and computes: tests/e2e/test_nodes_proxy.py."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import psycopg
import pytest

from pgplane.connlimits import ConnectionGate
from pgplane.core.nodes import Node
from pgplane.nodelink import messages
from pgplane.nodelink.authority import NodeAuthority, NodeTls
from pgplane.nodelink.client import Door, NodeLink
from pgplane.proxy.activity import Activity
from pgplane.proxy.doors.node import NodeDoor
from pgplane.proxy.forward import Forwarder
from pgplane.proxy.seam import AddressNotAllowed, Route, Target
from pgplane.proxy.server import Proxy
from pgplane.proxy.throttle import LoginThrottle
from tests.unit.test_proxy_server import AUTH_OK, ENDPOINT, OWN, READY, ScriptedCompute, connect


class Routes:
    """A node's view of the platform: each route is the next of ``targets`` (the last kept)."""

    def __init__(self, targets: list[Target], *, refuse: bool = False) -> None:
        self.targets = targets
        self.refuse = refuse
        self.routes: list[str] = []

    async def route(self, endpoint_id: str, role: str, *, client: str) -> Route:
        self.routes.append(client)
        if self.refuse:
            raise AddressNotAllowed(client)
        target = self.targets[min(len(self.routes) - 1, len(self.targets) - 1)]
        return Route(secret=OWN, target=target, client=client)

    async def wake(self, endpoint_id: str, *, force: bool) -> Target:
        return self.targets[-1]


async def _unasked(request: object) -> messages.Answer:
    raise AssertionError("no read is asked here")


@contextlib.asynccontextmanager
async def two_nodes(
    a_targets: list[Target], c_targets: list[Target], *, c_refuses: bool = False
) -> AsyncIterator[tuple[int, Routes, Routes]]:
    """Node A's proxy (its port) forwarding to node C's door; each node's routes."""
    authority = NodeAuthority.create()
    c_routes = Routes(c_targets, refuse=c_refuses)
    c_proxy = Proxy(
        computes=c_routes,
        activity=Activity(),
        proxy_host="localhost",
        server_tls=None,
        cert_hash=None,
    )
    a_tls, c_tls = NodeTls(authority, "node-a"), NodeTls(authority, "node-c")

    async def registry(name: str) -> Node | None:
        """Node A, up, with the certificate it shows registered (the only node C knows)."""
        if name != "node-a":
            return None
        return Node(
            name="node-a", instance="i", api_url="", proxy_address="", compute_host="",
            capacity=1, state="active", started_at=0, heartbeat_at=0, expires_at=1 << 62,
            door_certs=(a_tls.certificate.fingerprint,),
        )  # fmt: skip

    door = NodeDoor(
        tls=c_tls,
        nodes=registry,
        computes=c_routes,
        sessions=c_proxy.sessions,
        answers=_unasked,
        gate=ConnectionGate(per_address=8, total=64),
    )
    [(_, door_port)] = await door.start("127.0.0.1", 0)
    via = Door("node-c", f"127.0.0.1:{door_port}", (c_tls.certificate.fingerprint,))
    a_routes = Routes([Target(ENDPOINT, via=via) if t.via else t for t in a_targets])
    a_proxy = Proxy(
        computes=a_routes,
        activity=Activity(),
        proxy_host="localhost",
        server_tls=None,
        cert_hash=None,
        throttle=LoginThrottle(),
        forwarder=Forwarder(NodeLink(a_tls)),
    )
    [(_, port)] = await a_proxy.start("127.0.0.1", 0)
    try:
        yield port, a_routes, c_routes
    finally:
        await a_proxy.close()
        await door.close()


@contextlib.asynccontextmanager
async def compute() -> AsyncIterator[Target]:
    scripted = ScriptedCompute([AUTH_OK + READY])
    server = await asyncio.start_server(scripted.serve, "127.0.0.1", 0)
    try:
        yield Target(ENDPOINT, "127.0.0.1", server.sockets[0].getsockname()[1])
    finally:
        server.close()


ELSEWHERE = Target(ENDPOINT, via=Door("node-c", "placeholder:0", ()))
ON_B = Target(ENDPOINT, via=Door("node-b", "127.0.0.1:1", ()))


async def test_a_session_through_node_a_is_served_by_node_c() -> None:
    async with compute() as here, two_nodes([ELSEWHERE], [here]) as (port, a, c):
        conn = await connect(port)
        await conn.close()
    assert a.routes == ["127.0.0.1"] and c.routes == ["127.0.0.1"]


async def test_a_project_that_moved_meanwhile_is_routed_once_more() -> None:
    # A routes to C; C finds the project is B's now and says so; A's second route finds it at
    # home on A (say), and serves it there: no node relays to a third.
    async with compute() as here, two_nodes([ELSEWHERE, here], [ON_B]) as (port, a, c):
        conn = await connect(port)
        await conn.close()
    assert len(a.routes) == 2 and len(c.routes) == 1


async def test_the_owning_nodes_refusal_reaches_the_client_in_its_words() -> None:
    async with compute() as here, two_nodes([ELSEWHERE], [here], c_refuses=True) as (port, *_):
        with pytest.raises(
            psycopg.OperationalError, match=r"IP address 127\.0\.0\.1 is not allowed"
        ):
            await connect(port)
