"""Listening sockets, bound before anything else of a server starts.

``pgplane serve`` binds the ports its user chose first, so that a taken one fails the start at
once, naming its flag, before a store or a compute is touched, and so that no port the
platform lets the system choose (a node door's, an outgoing connection's) can take one of them.
"""

from __future__ import annotations

import socket
from collections.abc import Sequence
from typing import Any, NamedTuple

from pgplane.config import Settings

BACKLOG = 1024
API_BACKLOG = 2048  # uvicorn's
# What getaddrinfo gives: family, kind, protocol, canonical name, address.
AddrInfo = tuple[socket.AddressFamily, socket.SocketKind, int, str, Any]


def listening(infos: Sequence[AddrInfo], backlog: int = BACKLOG) -> list[socket.socket]:
    """A listening socket for each of ``infos`` (``getaddrinfo``'s); OSError if one cannot
    be bound (none is left open then)."""
    bound: list[socket.socket] = []
    try:
        for family, kind, proto, _, address in dict.fromkeys(infos):
            sock = socket.socket(family, kind, proto)
            bound.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
            sock.listen(backlog)
    except BaseException:
        for sock in bound:
            sock.close()
        raise
    return bound


def listen(host: str, port: int, backlog: int = BACKLOG) -> list[socket.socket]:
    """:func:`listening` on every address ``host`` names (blocking: before the loop serves)."""
    infos = socket.getaddrinfo(
        host, port, socket.AF_UNSPEC, socket.SOCK_STREAM, 0, socket.AI_PASSIVE
    )
    return listening(infos, backlog)


class Bound(NamedTuple):
    """The listening sockets of the API and of the proxy."""

    api: list[socket.socket]
    proxy: list[socket.socket]


def bind_ports(settings: Settings) -> Bound:
    """The ports the user chose, bound before anything else is made: a taken one fails the
    start at once, naming its flag, and no port the system chooses later (the node door's, an
    outgoing connection's) can be one of them."""
    ports = (
        ("API", settings.host, settings.port, API_BACKLOG, "--port"),
        ("Postgres proxy", settings.proxy_listen, settings.proxy_port, BACKLOG, "--proxy-port"),
    )
    bound: list[list[socket.socket]] = []
    for what, host, port, backlog, flag in ports:
        try:
            bound.append(listen(host, port, backlog))
        except OSError as exc:
            for sockets in bound:
                for sock in sockets:
                    sock.close()
            raise SystemExit(
                f"pgplane: the {what} cannot listen on {host}:{port} ({exc.strerror});"
                f" choose another port with {flag}"
            ) from None
    return Bound(*bound)
