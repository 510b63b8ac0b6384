"""What a client speaks, from its first byte, read without taking it off the socket.

A Postgres client's first packet (StartupMessage, SSLRequest, CancelRequest, GSSENCRequest)
starts with its length, at most 10 000: its first byte is 0. A TLS ClientHello is a handshake
record, content type 22 (0x16). An HTTP/1.1 request starts with its method, an upper-case token.
Anything else goes to the Postgres door, which refuses it as it always has.

The byte is peeked (``MSG_PEEK``) on the accepted socket before any transport owns it, so a
direct TLS ClientHello is still there for the TLS layer to read.
"""

from __future__ import annotations

import asyncio
import socket
from enum import Enum

ALPN_POSTGRES = "postgresql"  # PostgreSQL 17's direct TLS (sslnegotiation=direct)
ALPN_HTTP = "http/1.1"
_TLS_HANDSHAKE = 0x16


class Door(Enum):
    POSTGRES = "postgres"
    TLS = "tls"
    HTTP = "http"


def classify(first: bytes) -> Door:
    """The door for a connection whose first byte is ``first[0]``."""
    if not first:
        return Door.POSTGRES
    if first[0] == _TLS_HANDSHAKE:
        return Door.TLS
    if ord("A") <= first[0] <= ord("Z"):
        return Door.HTTP
    return Door.POSTGRES


async def peek(sock: socket.socket, n: int = 1) -> bytes:
    """Up to ``n`` bytes the client has sent, left on the socket; b"" if it closed first."""
    loop = asyncio.get_running_loop()
    while True:
        try:
            return sock.recv(n, socket.MSG_PEEK)
        except (BlockingIOError, InterruptedError):
            pass
        readable: asyncio.Future[None] = loop.create_future()
        fd = sock.fileno()
        loop.add_reader(fd, _ready, readable)
        try:
            await readable
        finally:
            loop.remove_reader(fd)


def _ready(readable: asyncio.Future[None]) -> None:
    if not readable.done():
        readable.set_result(None)
