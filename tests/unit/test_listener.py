"""The API's listening sockets: a burst of connections accepted at once, on uvloop too, and a
taken address named as asyncio names it."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable

import pytest
import uvloop

from pgplane.api.listener import Listener, bind

BURST = 32


Listen = Callable[[Callable[[], asyncio.Protocol]], Awaitable[socket.socket]]


async def _accepted_in_a_few_turns(listen: Listen) -> int:
    """How many of a burst of connections have their protocol within three turns of the loop,
    ``listen(factory)`` listening."""
    made: list[asyncio.BaseTransport] = []

    class Counted(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            made.append(transport)

    sock = await listen(Counted)
    port = sock.getsockname()[1]
    clients: list[socket.socket] = []
    try:
        # Connected by the kernel, waiting in the backlog.
        clients.extend(socket.create_connection(("127.0.0.1", port)) for _ in range(BURST))
        for _ in range(3):  # readiness, then the connections' transports and protocols
            await asyncio.sleep(0)
        return len(made)
    finally:
        for client in clients:
            client.close()
        for transport in made:
            transport.close()


def test_a_burst_of_connections_is_accepted_in_one_turn_where_uvloop_takes_one_a_turn() -> None:
    async def ours() -> int:
        listeners: list[Listener] = []

        async def listen(factory: Callable[[], asyncio.Protocol]) -> socket.socket:
            (sock,) = bind("127.0.0.1", 0, 128)
            listeners.append(Listener(sock, factory, 128))
            return sock

        try:
            return await _accepted_in_a_few_turns(listen)
        finally:
            for listener in listeners:
                listener.close()
                await listener.wait_closed()

    async def uvloops() -> int:
        servers: list[asyncio.Server] = []

        async def listen(factory: Callable[[], asyncio.Protocol]) -> socket.socket:
            server = await asyncio.get_running_loop().create_server(factory, "127.0.0.1", 0)
            servers.append(server)
            return server.sockets[0]  # type: ignore[return-value]

        try:
            return await _accepted_in_a_few_turns(listen)
        finally:
            for server in servers:
                server.close()

    assert uvloop.run(ours()) == BURST
    # What the Listener is for: uvloop's own server accepts one connection a turn (libuv's
    # choice), so a burst waits for as many turns as it has connections.
    assert uvloop.run(uvloops()) < BURST // 4


def test_a_taken_address_is_named() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(OSError, match=rf"API cannot listen on 127.0.0.1:{port} \("):
            bind("127.0.0.1", port, 16)
