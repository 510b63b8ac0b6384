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

from pgplane.proxy import scram, wire
from pgplane.proxy.activity import Activity
from pgplane.proxy.pipe import HANDSHAKE_BUFFER, Side
from pgplane.proxy.seam import Known, Password, Route, Secret, Target
from pgplane.proxy.server import Proxy
from pgplane.proxy.throttle import LoginThrottle

ENDPOINT = "ep-scripted-12345678"
PASSWORD = "secret"
OWN = Password(PASSWORD)


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

    def __init__(self, port: int, secret: Secret | None) -> None:
        self.target = Target(endpoint_id=ENDPOINT, host="127.0.0.1", port=port)
        self.secret = secret
        self.wakes: list[bool] = []
        self.routes = 0

    async def route(self, endpoint_id: str, role: str, *, client: str) -> Route:
        self.routes += 1
        return Route(secret=self.secret, target=self.target)

    async def wake(self, endpoint_id: str, *, force: bool) -> Target:
        self.wakes.append(force)
        return self.target


@contextlib.asynccontextmanager
async def proxied(
    compute: ScriptedCompute, secret: Secret | None = OWN
) -> AsyncIterator[tuple[int, Computes]]:
    server = await asyncio.start_server(compute.serve, "127.0.0.1", 0)
    computes = Computes(server.sockets[0].getsockname()[1], secret)
    proxy = Proxy(
        computes=computes,
        activity=Activity(),
        proxy_host="localhost",
        server_tls=None,
        cert_hash=None,
        throttle=LoginThrottle(failures_per_minute=3),
    )
    [(_, port)] = await proxy.start("127.0.0.1", 0)
    try:
        yield port, computes
    finally:
        await proxy.close()
        server.close()
        await server.wait_closed()


async def connect(port: int, password: str = PASSWORD) -> psycopg.AsyncConnection[object]:
    return await psycopg.AsyncConnection.connect(
        host="127.0.0.1",
        port=port,
        user="u",
        password=password,
        dbname="d",
        options=f"endpoint={ENDPOINT}",
        sslmode="disable",
        connect_timeout=30,
    )


AUTH_OK = wire.auth_message(wire.AUTH_OK)


READY = message(b"K", struct.pack("!I", 4242) + b"k" * 4) + message(b"Z", b"I")


@pytest.mark.parametrize(
    ("code", "text"),
    [
        (wire.CANNOT_CONNECT_NOW, "the database system is shutting down"),
        # A stop that began after the proxy reached the compute ends the login this way.
        (wire.ADMIN_SHUTDOWN, "terminating connection due to administrator command"),
        (wire.CRASH_SHUTDOWN, "terminating connection because of crash of another server process"),
    ],
)
async def test_a_compute_going_down_during_login_is_woken_and_tried_again(
    code: str, text: str
) -> None:
    compute = ScriptedCompute([wire.error_response(code, text), AUTH_OK + READY])
    async with proxied(compute) as (port, computes):
        conn = await connect(port)
        assert conn.info.backend_pid == 4242
        await conn.close()
    assert compute.connections == 2
    assert computes.wakes == [True]  # a start, though the store said it ran


async def test_a_real_refusal_reaches_the_client_and_wakes_nothing() -> None:
    refusal = wire.error_response("3D000", 'database "d" does not exist')
    compute = ScriptedCompute([refusal])
    async with proxied(compute) as (port, computes):
        with pytest.raises(psycopg.OperationalError, match='database "d" does not exist'):
            await connect(port)
    assert compute.connections == 1
    assert computes.wakes == []


@pytest.mark.parametrize("asks_password", [False, True])
async def test_a_stop_during_the_backends_start_up_is_not_the_clients_error(
    asks_password: bool,
) -> None:
    """Logged in by the proxy, the backend still starts (its parameters, its cancel key): a stop
    then ends it with 57P01, which the client, still connecting, must not be given. The compute
    trusts the proxy's socket, or (one started before that rule) asks for the password."""
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
    compute = ScriptedCompute(
        [AUTH_OK + started + ended, AUTH_OK + started + READY], password=asks_password
    )
    async with proxied(compute) as (port, computes):
        conn = await connect(port)
        assert conn.info.backend_pid == 4242
        await conn.close()
    assert compute.connections == 2
    assert computes.wakes == [True]


@pytest.mark.parametrize("secret", [None, Password(PASSWORD)], ids=["unknown role", "wrong"])
async def test_a_login_that_does_not_prove_its_password_reaches_no_compute(
    secret: Secret | None,
) -> None:
    compute = ScriptedCompute([AUTH_OK + READY])
    async with proxied(compute, secret) as (port, computes):
        with pytest.raises(
            psycopg.OperationalError, match='password authentication failed for user "u"'
        ):
            await connect(port, password="not-it" if secret else PASSWORD)
    assert compute.connections == 0
    assert computes.wakes == []


async def test_a_role_known_by_its_verifier_logs_in() -> None:
    compute = ScriptedCompute([AUTH_OK + READY])
    async with proxied(compute, Known(scram.derive_verifier("made-with-sql"))) as (port, _):
        conn = await connect(port, password="made-with-sql")
        await conn.close()
    assert compute.connections == 1


async def test_wrong_passwords_are_throttled_per_address_without_deriving_keys() -> None:
    compute = ScriptedCompute([AUTH_OK + READY])
    async with proxied(compute) as (port, _):
        for _ in range(3):
            with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
                await connect(port, password="guess")
        with pytest.raises(psycopg.OperationalError, match="too many failed logins"):
            await connect(port, password=PASSWORD)  # refused before its password is looked at
    assert compute.connections == 0


async def test_a_compute_asking_for_a_huge_iteration_count_is_refused() -> None:
    """A tenant can raise its compute's scram_iterations; the proxy never derives a key for it
    (a count of two billion would hold a thread for many minutes)."""

    class Greedy(ScriptedCompute):
        async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            (length,) = struct.unpack("!I", await reader.readexactly(4))
            await reader.readexactly(length - 4)
            self.connections += 1
            writer.write(wire.auth_message(wire.AUTH_SASL, scram.MECHANISM.encode() + b"\0\0"))
            header = await reader.readexactly(5)
            first = await reader.readexactly(struct.unpack("!I", header[1:])[0] - 4)
            nonce = first.split(b"r=", 1)[1].decode()
            server_first = f"r={nonce}x,s=c2FsdHNhbHQ=,i=2000000000"
            writer.write(wire.auth_message(wire.AUTH_SASL_CONTINUE, server_first.encode()))
            await writer.drain()
            await reader.read()
            writer.close()

    compute = Greedy([])
    async with proxied(compute) as (port, _):
        with pytest.raises(psycopg.OperationalError, match="iteration count 2000000000"):
            await connect(port)
    assert compute.connections == 1


class _Transport:
    def __init__(self) -> None:
        self.paused = False

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False

    def is_closing(self) -> bool:
        return False


async def test_bytes_before_login_are_bounded_by_back_pressure() -> None:
    side = Side()
    transport = _Transport()
    side.connection_made(transport)  # type: ignore[arg-type]
    for _ in range(100):
        side.data_received(b"x" * 64 * 1024)
        if transport.paused:
            break
    assert transport.paused
    assert len(side._buffer) <= HANDSHAKE_BUFFER + 64 * 1024
    await side.read_exactly(HANDSHAKE_BUFFER // 2 + 64 * 1024)
    assert not transport.paused  # read down: the client may send again
