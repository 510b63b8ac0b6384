"""Which HTTP request goes where: ``GET /v2`` upgraded to a WebSocket, ``/sql`` to the SQL-over-HTTP
handler when one is plugged in, anything else a JSON 404."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol

from pgplane.proxy.doors.http import HttpReply, HttpRequest, Upgrade


class SqlHandler(Protocol):
    """SQL over HTTP (Neon's ``POST /sql``), plugged into the proxy's HTTP door.

    It is given every request to ``/sql``, whatever its method (a browser's CORS preflight is an
    ``OPTIONS``), whole and bounded (:class:`~pgplane.proxy.doors.http.HttpLimits`), with the
    client's address in :attr:`HttpRequest.peer` for the allow-list and the throttle, and
    returns the reply; the door sets ``Content-Type: application/json`` and the length, and
    keeps the connection alive after it. An exception it lets out becomes a JSON 500 (and is
    logged): errors it means are replies. The door bounds the request, not the handler's work:
    the handler bounds its own time and results.

    To log in it uses the doors' shared steps,
    :meth:`pgplane.proxy.session.Sessions.open_with_password` (``Proxy.sessions``): the
    allow-list, the wrong-password throttle and no wake before the password, as on TCP.
    """

    async def handle(self, request: HttpRequest) -> HttpReply: ...

    async def check(self, request: HttpRequest) -> tuple[HttpReply | None, object]:
        """The door's :data:`~pgplane.proxy.doors.http.HeadCheck` for ``/sql``: the login
        proven from the head, before a byte of the body is read."""
        ...


WebSocketDoor = Callable[[HttpRequest], Awaitable[HttpReply | Upgrade]]


class Router:
    def __init__(self, *, websocket: WebSocketDoor, sql: SqlHandler | None) -> None:
        self._websocket = websocket
        self._sql = sql

    async def check_head(self, request: HttpRequest) -> tuple[HttpReply | None, object]:
        if request.path == "/sql" and self._sql is not None:
            return await self._sql.check(request)
        return None, None

    async def __call__(self, request: HttpRequest) -> HttpReply | Upgrade:
        path = request.path
        if path == "/v2":
            if request.method != "GET":
                return HttpReply.error(
                    405, "GET /v2 with a WebSocket upgrade", "METHOD_NOT_ALLOWED"
                )
            if (request.header("upgrade") or "").lower() != "websocket":
                return HttpReply.error(
                    426, "/v2 is a WebSocket: send Upgrade: websocket", "UPGRADE_REQUIRED"
                )
            return await self._websocket(request)
        if path == "/sql" and self._sql is not None:
            return await self._sql.handle(request)
        return HttpReply.error(404, f"no such path: {path[:200]}")
