"""The proxy's login to a compute, against a scripted compute: which refusals mean "wait for the
next start" and which reach the client. End to end, the restart storm (tests/e2e/
test_restart_storm.py) meets the same refusals from real Postgres, at moments it cannot choose."""

from __future__ import annotations

import asyncio
import contextlib
import struct
from collections.abc import AsyncIterator

import psycopg
import pytest

from pgplane.proxy import wire
from pgplane.proxy.activity import Activity
from pgplane.proxy.server import Proxy, Route, Target

ENDPOINT = "ep-scripted-12345678"


def message(kind: bytes, payload: bytes) -> bytes:
    return kind + struct.pack("!I", len(payload) + 4) + payload


class ScriptedCompute:
    """Answers each connection's startup (and, with ``password``, the password it asks for in
    clear) with the next reply of ``replies``."""

    def __init__(self, replies: list[bytes], *, password: bool = False) -> None:
        self.replies = replies
        self.password = password
        self.connections = 0

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        (length,) = struct.unpack("!I", await reader.readexactly(4))
        await reader.readexactly(length - 4)
        if self.password:
            writer.write(wire.auth_message(wire.AUTH_CLEARTEXT))
            header = await reader.readexactly(5)
            await reader.readexactly(struct.unpack("!I", header[1:])[0] - 4)
        reply = self.replies[min(self.connections, len(self.replies) - 1)]
        self.connections += 1
        writer.write(reply)
        await writer.drain()
        if reply.startswith(b"E"):
            writer.close()  # as Postgres after a FATAL
        else:
            await reader.read()  # the session, until the client leaves
        writer.close()


class Computes:
    """The platform as the proxy sees it: the compute runs (says the store); wakes are counted."""

    def __init__(self, port: int, password: str | None) -> None:
        self.target = Target(endpoint_id=ENDPOINT, host="127.0.0.1", port=port)
        self.password = password  # None: Postgres authenticates
        self.wakes: list[bool] = []

    async def route(self, endpoint_id: str, role: str) -> Route:
        return Route(password=self.password, target=self.target)

    async def wake(self, endpoint_id: str, *, force: bool) -> Target:
        self.wakes.append(force)
        return self.target


@contextlib.asynccontextmanager
async def proxied(
    compute: ScriptedCompute, password: str | None = None
) -> AsyncIterator[tuple[int, Computes]]:
    server = await asyncio.start_server(compute.serve, "127.0.0.1", 0)
    computes = Computes(server.sockets[0].getsockname()[1], password)
    proxy = Proxy(
        computes=computes,
        activity=Activity(),
        proxy_host="localhost",
        server_tls=None,
        cert_hash=None,
    )
    [(_, port)] = await proxy.start("127.0.0.1", 0)
    try:
        yield port, computes
    finally:
        await proxy.close()
        server.close()
        await server.wait_closed()


async def first_reply(port: int) -> bytes:
    """What a client is sent first after its startup."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        startup = wire.Startup(
            wire.PROTOCOL_3, {"user": "u", "database": "d", "options": f"endpoint={ENDPOINT}"}
        )
        writer.write(startup.encode())
        header = await asyncio.wait_for(reader.readexactly(5), 30)
        (length,) = struct.unpack("!I", header[1:])
        return header + await reader.readexactly(length - 4)
    finally:
        writer.close()


AUTH_OK = wire.auth_message(wire.AUTH_OK)


@pytest.mark.parametrize(
    ("code", "message"),
    [
        (wire.CANNOT_CONNECT_NOW, "the database system is shutting down"),
        # A stop that began after the proxy reached the compute ends the login this way.
        (wire.ADMIN_SHUTDOWN, "terminating connection due to administrator command"),
        (wire.CRASH_SHUTDOWN, "terminating connection because of crash of another server process"),
    ],
)
async def test_a_compute_going_down_during_login_is_woken_and_tried_again(
    code: str, message: str
) -> None:
    compute = ScriptedCompute([wire.error_response(code, message), AUTH_OK])
    async with proxied(compute) as (port, computes):
        assert await first_reply(port) == AUTH_OK
    assert compute.connections == 2
    assert computes.wakes == [True]  # a start, though the store said it ran


async def test_a_real_refusal_reaches_the_client_and_wakes_nothing() -> None:
    refusal = wire.error_response("3D000", 'database "d" does not exist')
    compute = ScriptedCompute([refusal])
    async with proxied(compute) as (port, computes):
        assert await first_reply(port) == refusal
    assert compute.connections == 1
    assert computes.wakes == []


async def test_a_stop_during_the_backends_start_up_is_not_the_clients_error() -> None:
    """Logged in by the proxy, the backend still starts (its parameters, its cancel key): a stop
    then ends it with 57P01, which the client, still connecting, must not be given."""
    started = b"".join(
        message(b"S", name + b"\0" + value + b"\0")
        for name, value in [
            (b"server_version", b"17.0"),
            (b"client_encoding", b"UTF8"),
            (b"standard_conforming_strings", b"on"),
            (b"integer_datetimes", b"on"),
        ]
    )
    ended = wire.error_response(
        wire.ADMIN_SHUTDOWN, "terminating connection due to administrator command"
    )
    ready = message(b"K", struct.pack("!I", 4242) + b"k" * 4) + message(b"Z", b"I")
    compute = ScriptedCompute([AUTH_OK + started + ended, AUTH_OK + started + ready], password=True)
    async with proxied(compute, password="secret") as (port, computes):
        conn = await psycopg.AsyncConnection.connect(
            host="127.0.0.1",
            port=port,
            user="u",
            password="secret",
            dbname="d",
            options=f"endpoint={ENDPOINT}",
            sslmode="disable",
            connect_timeout=30,
        )
        assert conn.info.backend_pid == 4242
        await conn.close()
    assert compute.connections == 2
    assert computes.wakes == [True]
