"""Dialling another node's door: TLS with this node's certificate, the other end checked to be
the node the store names, showing a certificate that node registered there, then one request
and its answer."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from pgplane.nodelink import messages
from pgplane.nodelink.authority import NodeTls, Peer, peer_of

P = TypeVar("P", bound=asyncio.BaseProtocol)

CONNECT_SECONDS = 10.0


class Unreachable(Exception):
    """The node's door could not be reached, or was not that node's; the message names it."""


@dataclass(frozen=True, slots=True)
class Door:
    """Where a node's door listens, as the node registered it (``host:port``), and the
    fingerprints of the certificates it registered with it."""

    node: str
    address: str
    certs: tuple[str, ...]

    def host_port(self) -> tuple[str, int]:
        host, sep, port = self.address.rpartition(":")
        if not sep or not port.isdigit():
            raise Unreachable(f"node {self.node} has no node door registered; retry shortly")
        return host.strip("[]"), int(port)


class NodeLink:
    def __init__(self, tls: NodeTls, *, connect_seconds: float = CONNECT_SECONDS) -> None:
        self._tls = tls
        self._connect_seconds = connect_seconds

    @property
    def node(self) -> str:
        """This node's name."""
        return self._tls.node

    async def dial(self, door: Door, factory: Callable[[], P]) -> P:
        """A TLS connection to ``door`` whose far end proved it is ``door.node``."""
        host, port = door.host_port()
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self._connect_seconds):
                transport, protocol = await loop.create_connection(
                    factory, host, port, ssl=self._tls.client
                )
        except (OSError, TimeoutError, ssl.SSLError) as exc:
            raise Unreachable(f"node {door.node} cannot be reached: {_why(exc)}") from None
        _check(door, peer_of(transport.get_extra_info("ssl_object")), transport.close)
        return protocol

    async def call(
        self,
        door: Door,
        request: messages.Request,
        *,
        limit: int = messages.MAX_ANSWER,
        seconds: float | None = None,
    ) -> messages.Answer:
        """Ask ``door``'s node one thing and read its answer (within ``seconds``)."""
        host, port = door.host_port()
        try:
            async with asyncio.timeout(self._connect_seconds):
                reader, writer = await asyncio.open_connection(host, port, ssl=self._tls.client)
        except (OSError, TimeoutError, ssl.SSLError) as exc:
            raise Unreachable(f"node {door.node} cannot be reached: {_why(exc)}") from None
        try:
            _check(door, peer_of(writer.get_extra_info("ssl_object")), writer.close)
            writer.write(messages.frame(request))
            async with asyncio.timeout(seconds):
                size = messages.length(await reader.readexactly(messages.HEADER), limit=limit)
                return messages.answer(await reader.readexactly(size))
        except (OSError, asyncio.IncompleteReadError, ssl.SSLError) as exc:
            raise Unreachable(f"node {door.node} ended the connection: {_why(exc)}") from None
        except TimeoutError:
            raise Unreachable(f"node {door.node} did not answer within {seconds} s") from None
        finally:
            writer.close()


def _check(door: Door, found: Peer | None, close: Callable[[], None]) -> None:
    if found is None or found.node != door.node:
        close()
        # A stale address, now another node's (or another platform's: its certificate would
        # not have passed): nothing is asked of it.
        name = None if found is None else found.node
        raise Unreachable(f"the node door at {door.address} is {name}'s, not {door.node}'s")
    if not found.registered(door.certs):
        close()
        # Signed by the authority but not registered by the node: minted by whoever read the
        # authority's key, or the node renewed its own since the store was read.
        raise Unreachable(
            f"the node door at {door.address} showed a certificate node {door.node} did not"
            " register; retry shortly"
        )


def _why(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "no answer in time"
    return str(exc) or type(exc).__name__
