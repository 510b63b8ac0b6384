"""The pipe once piped: each side hands its transport to a protocol whose ``data_received`` is
the peer's write (no Python frame, no count per chunk), and the session's activity is read off
the client's TCP connection instead. On uvloop (what ``serve`` runs) and on asyncio's own loop."""

from __future__ import annotations

import asyncio
import os
import socket

import pytest
import uvloop

from pgplane.proxy.activity import Activity
from pgplane.proxy.pipe import Side, tcp_activity

PAYLOAD = os.urandom(4 << 20)


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while data := await reader.read(1 << 16):
        writer.write(data)
        await writer.drain()
    writer.close()


async def _piped_round_trip() -> None:
    loop = asyncio.get_running_loop()
    compute_server = await asyncio.start_server(_echo, "127.0.0.1", 0)
    accepted: list[Side] = []

    def door() -> Side:
        accepted.append(Side())
        return accepted[-1]

    proxy = await loop.create_server(door, "127.0.0.1", 0)
    try:
        reader, writer = await asyncio.open_connection(*proxy.sockets[0].getsockname()[:2])
        _, compute = await loop.create_connection(
            Side, *compute_server.sockets[0].getsockname()[:2]
        )
        while not accepted:
            await asyncio.sleep(0)
        client = accepted[0]
        await client.made
        session = Activity().open("ep-test", now=0)
        session.kernel = tcp_activity(client.transport)
        assert session.kernel is not None
        before = session.count()
        compute.pipe_to(client, session)
        client.pipe_to(compute, session)
        for side in (client, compute):
            assert type(side.transport.get_protocol()).__name__ == "_Forwarding"

        writer.write(PAYLOAD)
        got = await reader.readexactly(len(PAYLOAD))
        assert got == PAYLOAD
        assert session.ticks == 0  # not one chunk counted in Python
        # The kernel's count: all the client sent, and (acknowledged so far) what it was sent.
        assert session.count() - before > len(PAYLOAD)

        writer.close()  # the client's end closes the compute's side, and the client's
        await asyncio.wait_for(asyncio.gather(client.lost, compute.lost), 10)
        moved = session.count()
        assert session.count() == moved  # closed: its last count, never another socket's
    finally:
        proxy.close()
        compute_server.close()


@pytest.mark.parametrize("runner", ["uvloop", "asyncio"])
def test_a_piped_session_moves_its_bytes_without_python_per_chunk(runner: str) -> None:
    (uvloop.run if runner == "uvloop" else asyncio.run)(_piped_round_trip())


def test_no_count_off_a_unix_connection() -> None:
    async def unix() -> None:
        ours, theirs = socket.socketpair()
        transport, _ = await asyncio.get_running_loop().connect_accepted_socket(Side, ours)
        assert tcp_activity(transport) is None
        transport.close()
        theirs.close()

    asyncio.run(unix())
