"""Listening sockets and their accept loops, for the proxy's doors and the node door: each
accepted connection handed to a task of its own, every task cancelled at close."""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
from collections.abc import Callable, Coroutine

from pgplane.listening import listening
from pgplane.telemetry.sparse import Sparse

log = logging.getLogger(__name__)
said = Sparse(log)  # warnings a flood of connections may cause

Serve = Callable[[socket.socket, object], Coroutine[object, object, None]]


class Listener:
    def __init__(self, serve: Serve) -> None:
        self._serve = serve
        self._listeners: list[socket.socket] = []
        self._accepting: list[asyncio.Task[None]] = []
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self, host: str, port: int) -> list[tuple[str, int]]:
        """Listen on every address ``host`` names; the addresses bound (port 0: the system's)."""
        loop = asyncio.get_running_loop()
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        return self.adopt(listening(infos))

    def adopt(self, sockets: list[socket.socket]) -> list[tuple[str, int]]:
        """Accept on ``sockets``, bound and listening already; their addresses."""
        loop = asyncio.get_running_loop()
        for listener in sockets:
            listener.setblocking(False)
            self._listeners.append(listener)
            self._accepting.append(loop.create_task(self._accept_loop(listener)))
        return [listener.getsockname()[:2] for listener in sockets]

    async def close(self) -> None:
        # The accept loops first: a listening socket is closed once nothing waits on it.
        for task in self._accepting:
            task.cancel()
        await asyncio.gather(*self._accepting, return_exceptions=True)
        self._close_listeners()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _close_listeners(self) -> None:
        for listener in self._listeners:
            listener.close()
        self._listeners.clear()

    def spawn(self, coro: Coroutine[object, object, None]) -> None:
        """Run ``coro`` as one of the connections' tasks (cancelled at close)."""
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _accept_loop(self, listener: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                sock, address = await loop.sock_accept(listener)
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    # Out of descriptors (the caps are sized to leave some; others use them
                    # too): the connection waits in the backlog, and is taken once one frees.
                    said.warning("accept", "cannot accept a connection: %s", exc)
                    await asyncio.sleep(0.1)
                    continue
                if listener.fileno() < 0:
                    return
                raise
            sock.setblocking(False)
            if sock.family in (socket.AF_INET, socket.AF_INET6):
                # Every message of the pipe is sent as it comes (uvloop sets this itself; asyncio
                # does not for an accepted socket, and Nagle would hold a reply for an ACK).
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.spawn(self._serve(sock, address))
