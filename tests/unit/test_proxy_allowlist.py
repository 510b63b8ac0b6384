"""The proxy's side of the IP allow-list, against a scripted platform and compute: a client the
platform's route refuses for its address is told so in Neon's words before it is asked for a
password, and leaves no trace (no wake, no compute dialled, no throttle, no activity); a cancel
request from an address off the session's list is dropped. End to end, with the real platform,
see tests/e2e/test_allowed_ips.py."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator

import psycopg

from pgplane.core.ipallow import AllowList, allow_list
from pgplane.proxy import wire
from pgplane.proxy.activity import Activity
from pgplane.proxy.seam import Route, Target, admit
from pgplane.proxy.server import Proxy
from pgplane.proxy.throttle import LoginThrottle
from tests import pgclient
from tests.unit.test_proxy_server import AUTH_OK, ENDPOINT, OWN, READY, ScriptedCompute

NEON_TEXT = (
    "This IP address 127.0.0.2 is not allowed to connect to this endpoint. Please add it to"
    " the allowed list in the project's settings (settings.allowed_ips; neonctl ip-allow add)."
    " Make sure to check for IPv4 or IPv6 addresses."
)


class Computes:
    """The platform as the proxy sees it, with an allow-list: the check of :func:`admit`."""

    def __init__(self, port: int, allowed: AllowList) -> None:
        self.target = Target(endpoint_id=ENDPOINT, host="127.0.0.1", port=port)
        self.allowed = allowed
        self.clients: list[str] = []
        self.wakes = 0

    async def route(self, endpoint_id: str, role: str, *, client: str) -> Route:
        self.clients.append(client)
        admit(client, self.allowed)
        return Route(secret=OWN, target=self.target, allowed=self.allowed)

    async def wake(self, endpoint_id: str, *, force: bool) -> Target:
        self.wakes += 1
        return self.target


@contextlib.asynccontextmanager
async def proxied(
    compute: ScriptedCompute, allowed: AllowList
) -> AsyncIterator[tuple[int, Computes, Activity, LoginThrottle]]:
    server = await asyncio.start_server(compute.serve, "127.0.0.1", 0)
    computes = Computes(server.sockets[0].getsockname()[1], allowed)
    activity, throttle = Activity(), LoginThrottle(failures_per_minute=1)
    proxy = Proxy(
        computes=computes,
        activity=activity,
        proxy_host="localhost",
        server_tls=None,
        cert_hash=None,
        throttle=throttle,
    )
    [(_, port)] = await proxy.start("127.0.0.1", 0)
    try:
        yield port, computes, activity, throttle
    finally:
        await proxy.close()
        server.close()
        await server.wait_closed()


def _login(port: int, source: str, password: str) -> pgclient.Login:
    login = pgclient.login(
        port, source=source, endpoint=ENDPOINT, user="u", password=password, database="d"
    )
    login.sock.close()
    return login


async def test_an_address_off_the_list_is_refused_in_neons_words_before_its_password() -> None:
    compute = ScriptedCompute([AUTH_OK + READY])
    async with proxied(compute, allow_list(["127.0.0.1"])) as (port, computes, activity, throttle):
        for password in ("secret", "wrong", "wrong"):
            refused = await asyncio.to_thread(_login, port, "127.0.0.2", password)
            assert (refused.code, refused.error) == (wire.INTERNAL_ERROR, NEON_TEXT)
        assert computes.clients == ["127.0.0.2"] * 3
        assert computes.wakes == 0
        assert compute.connections == 0
        assert activity.sample(0) == {}
        # Three wrong passwords, none counted: the throttle (one a minute) has seen nothing.
        assert throttle.wait(ENDPOINT, "127.0.0.2") == 0
        # From the listed address the same login goes through.
        conn = await psycopg.AsyncConnection.connect(
            host="127.0.0.1",
            port=port,
            user="u",
            password="secret",
            dbname="d",
            options=f"endpoint={ENDPOINT}",
            sslmode="disable",
        )
        await conn.close()
    assert compute.connections == 1


async def test_the_refusal_is_an_error_as_neons_is() -> None:
    compute = ScriptedCompute([AUTH_OK + READY])
    async with proxied(compute, allow_list(["10.0.0.0/8"])) as (port, _, _, _):

        def raw() -> dict[str, str]:
            with pgclient.connect(port, source="127.0.0.2") as sock:
                startup = wire.Startup(
                    wire.PROTOCOL_3, {"user": "u", "options": f"endpoint={ENDPOINT}"}
                )
                sock.sendall(startup.encode())
                kind, payload = pgclient._read_message(sock)
                assert kind == b"E"
                return wire.error_fields(payload)

        fields = await asyncio.to_thread(raw)
    # Severity ERROR and SQLSTATE XX000, as Neon's proxy sends every refusal of its own.
    assert (fields["S"], fields["V"], fields["C"]) == ("ERROR", "ERROR", "XX000")


async def test_a_cancel_request_from_off_the_list_is_dropped() -> None:
    compute = ScriptedCompute([AUTH_OK + READY])
    async with proxied(compute, allow_list(["127.0.0.1"])) as (port, _, _, _):
        conn = await psycopg.AsyncConnection.connect(
            host="127.0.0.1",
            port=port,
            user="u",
            password="secret",
            dbname="d",
            options=f"endpoint={ENDPOINT}",
            sslmode="disable",
        )
        assert compute.connections == 1

        def cancel(source: str) -> None:
            with pgclient.connect(port, source=source) as sock:
                sock.sendall(wire.cancel_request(4242, b"kkkk"))
                sock.shutdown(socket.SHUT_WR)
                assert sock.recv(1) == b""  # no answer either way, as Postgres

        # The proxy has dialled the compute, when it does, before the client sees the end.
        await asyncio.to_thread(cancel, "127.0.0.2")
        await asyncio.to_thread(cancel, "127.0.0.1")
        for _ in range(100):
            if compute.connections == 2:
                break
            await asyncio.sleep(0.02)
        assert compute.connections == 2  # passed on to the compute
        # A login after both: the compute takes its connections in order, so by the time it
        # answered this one it had counted the dropped cancel too, had it been passed on.
        later = await psycopg.AsyncConnection.connect(
            host="127.0.0.1",
            port=port,
            user="u",
            password="secret",
            dbname="d",
            options=f"endpoint={ENDPOINT}",
            sslmode="disable",
        )
        assert compute.connections == 3  # the one from off the list was not
        await later.close()
        await conn.close()
