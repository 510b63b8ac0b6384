"""The API's listening sockets, each accepting every connection that waits as soon as it can.

uvloop's servers accept one connection per turn of the event loop: libuv does so on purpose
(libuv/libuv#3696, in every libuv uvloop ships since 1.45), so that processes sharing a socket
share its connections. A busy server's turn serves every request that has come in, so a burst of
new connections waits for as many turns as it has connections, each longer than the last: 64
clients connecting to a loaded server waited up to 350 ms for their first answer, while each
later request took 11 ms. Here a listening socket that is ready accepts all that waits (up to
the backlog, as asyncio's own loop does) and hands each connection to the loop's transports,
uvloop's still.

:class:`ApiServer` is uvicorn's server listening so, and ending as ``pgplane serve`` needs.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import socket
import sys
from collections.abc import Callable, Iterator
from typing import Any, cast

import uvicorn

from pgplane.listening import listen

log = logging.getLogger(__name__)

# Out of descriptors or kernel memory: nothing more can be accepted for now, so the socket is left
# alone for a while (as asyncio's loop does) instead of waking the loop for ever.
_NO_RESOURCES = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
_RETRY_SECONDS = 1.0
_STARTUP_FAILURE = 3  # uvicorn's exit status when it cannot start


class Listener:
    """One listening socket whose connections get ``factory``'s protocols; what uvicorn's server
    keeps of an ``asyncio.Server`` (``sockets``, ``close``, ``wait_closed``)."""

    def __init__(
        self, sock: socket.socket, factory: Callable[[], asyncio.Protocol], backlog: int
    ) -> None:
        self._sock = sock
        self._factory = factory
        self._backlog = backlog
        self._loop = asyncio.get_running_loop()
        self._opening: set[asyncio.Task[None]] = set()
        self._closed = False
        sock.setblocking(False)
        self._loop.add_reader(sock.fileno(), self._accept)

    @property
    def sockets(self) -> tuple[socket.socket, ...]:
        return (self._sock,)

    def _accept(self) -> None:
        for _ in range(self._backlog):
            try:
                conn, _ = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                return  # all accepted
            except ConnectionAbortedError:
                continue  # the client left before it was accepted
            except OSError as exc:
                if exc.errno not in _NO_RESOURCES:
                    raise
                self._pause(exc)
                return
            conn.setblocking(False)
            # Each response is written in two parts (head, body): without TCP_NODELAY the body
            # would wait for the client's delayed acknowledgement of the head.
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            task = self._loop.create_task(self._open(conn))
            self._opening.add(task)
            task.add_done_callback(self._opening.discard)

    def _pause(self, exc: OSError) -> None:
        log.error("cannot accept connections for %g s: %s", _RETRY_SECONDS, exc.strerror)
        self._loop.remove_reader(self._sock.fileno())
        self._loop.call_later(_RETRY_SECONDS, self._resume)

    def _resume(self) -> None:
        if not self._closed:
            self._loop.add_reader(self._sock.fileno(), self._accept)

    async def _open(self, conn: socket.socket) -> None:
        try:
            await self._loop.connect_accepted_socket(self._factory, conn)
        except OSError:  # gone before its transport was made
            conn.close()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._loop.remove_reader(self._sock.fileno())
            self._sock.close()

    async def wait_closed(self) -> None:
        # The connections' own ends are uvicorn's to wait for; only those still being opened here.
        if self._opening:
            await asyncio.gather(*self._opening, return_exceptions=True)


def bind(host: str, port: int, backlog: int) -> list[socket.socket]:
    """Listening sockets for every address of ``host``; OSError says which port was taken."""
    try:
        return listen(host, port, backlog)
    except OSError as exc:
        raise OSError(
            exc.errno, f"the API cannot listen on {host}:{port} ({exc.strerror})"
        ) from None


class ApiServer(uvicorn.Server):
    """uvicorn's server on :class:`Listener` sockets, minus its last act on a signal.

    After SIGTERM or SIGINT, uvicorn's ``serve()`` raises the signal again once it has stopped
    serving, so that its default action ends the process. That ended the process before
    ``pgplane serve`` could stop the proxy, the engine (whose handlers clean up when cancelled),
    the driver and the store: a graceful stop was a kill. Here the process ends when ``serve()``
    returns, with status 0.
    """

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        """uvicorn's start (the lifespan, then the listeners), on listeners of our own."""
        if self.config.ssl is not None:  # TLS is uvicorn's own servers' to terminate
            await super().startup(sockets)
            return
        await self.lifespan.startup()
        if self.lifespan.should_exit:
            sys.exit(_STARTUP_FAILURE)
        config = self.config

        def create_protocol() -> asyncio.Protocol:
            return config.http_protocol_class(  # type: ignore[call-arg]
                config=config, server_state=self.server_state, app_state=self.lifespan.state
            )

        bound = sockets or await self._bind()
        # uvicorn keeps asyncio servers here, and uses only what a Listener has of them.
        self.servers = cast("Any", [Listener(s, create_protocol, config.backlog) for s in bound])
        self._log_started_message(bound)
        self.started = True

    async def _bind(self) -> list[socket.socket]:
        """The listening sockets; if one cannot be bound, the process ends as uvicorn's would,
        having said why."""
        config = self.config
        try:
            return bind(config.host, config.port, config.backlog)
        except OSError as exc:
            failure = exc
        log.error("%s", failure)
        await self.lifespan.shutdown()
        sys.exit(_STARTUP_FAILURE)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        with super().capture_signals():
            try:
                yield
            finally:
                self._captured_signals.clear()
