"""``POST /sql``: one request, authenticated as the TCP door authenticates, run on the compute.

In order, through the steps every door shares (:class:`~pgplane.proxy.session.Sessions`): the
request is read (bounded; anything malformed refused), the endpoint is routed with the client's
address (the project's IP allow-list refuses before any password is looked at; an endpoint
nobody has, another account's as well, fails as a wrong password does), wrong passwords
are throttled per endpoint and address together with the other doors', the password is checked
(the same work for every role, known or not), and only then is a compute woken, if it sleeps.
Every refusal is the one a Postgres client of the TCP door gets, as Neon's error JSON. The
request counts as activity for idle suspend; the pooled connection it ran on does not.

The HTTP door hands every request to ``/sql`` to :meth:`SqlOverHttp.handle` (a
:class:`~pgplane.proxy.doors.router.SqlHandler`): ``POST`` is answered by :meth:`SqlOverHttp.answer`
(headers, body and the client's address in; status, headers and body out), a browser's CORS
preflight (``OPTIONS``) as Neon's proxy answers it. Every refusal is Neon's error JSON.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field

from pgplane.core import clock
from pgplane.errors import MethodNotAllowed, PgplaneError, SqlFailed
from pgplane.nodelink.client import Unreachable
from pgplane.proxy import scram, wire
from pgplane.proxy.doors.http import HttpReply, HttpRequest
from pgplane.proxy.pipe import Closed
from pgplane.proxy.seam import Route, RouteError
from pgplane.proxy.session import Sessions
from pgplane.proxy.sqlhttp import messages, render
from pgplane.proxy.sqlhttp.pool import Conn, Key, Pool
from pgplane.proxy.sqlhttp.request import (
    DEFERRABLE,
    ISOLATION,
    ISOLATION_LEVELS,
    READ_ONLY,
    Head,
    Login,
    SqlRequest,
    headers_of,
    parse_body,
    parse_head,
)
from pgplane.proxy.sqlhttp.run import Limits, Stale, execute, unwrap

log = logging.getLogger(__name__)

_CANCEL_SECONDS = 5.0
# A body larger than this is read off the event loop (a few ms of parsing at most on it).
_READ_ON_LOOP = 64 << 10
# Neon's proxy answers any origin: the driver runs in browsers too.
_ANY_ORIGIN = ("Access-Control-Allow-Origin", "*")


# What a browser's preflight is told it may send (Neon's list, and the batch flag it lacks).
_PREFLIGHT = [
    _ANY_ORIGIN,
    ("Allow", "OPTIONS, POST"),
    ("Access-Control-Allow-Methods", "OPTIONS, POST"),
    (
        "Access-Control-Allow-Headers",
        "Authorization, Content-Type, Neon-Connection-String, Neon-Raw-Text-Output,"
        " Neon-Array-Mode, Neon-Pool-Opt-In, Neon-Batch-Read-Only, Neon-Batch-Isolation-Level,"
        " Neon-Batch-Deferrable",
    ),
    ("Access-Control-Max-Age", "86400"),
]


@dataclass(frozen=True, slots=True)
class _Proven:
    """A login :meth:`SqlOverHttp.check` proved from a request's head, and its route."""

    login: Login
    route: Route


@dataclass(frozen=True, slots=True)
class Reply:
    status: int
    body: bytes
    headers: list[tuple[str, str]] = field(default_factory=list)


class SqlOverHttp:
    def __init__(
        self, *, sessions: Sessions, limits: Limits | None = None, pool: Pool | None = None
    ) -> None:
        # The doors' shared steps: route, allow-list, throttle, password, wake, activity.
        self._sessions = sessions
        self._limits = limits or Limits()
        self._pool = pool or Pool()

    @property
    def limits(self) -> Limits:
        return self._limits

    def close(self) -> None:
        self._pool.close()

    async def check(self, request: HttpRequest) -> tuple[HttpReply | None, object]:
        """A ``POST``'s login proven from its head, before its body is read: a stranger's is
        refused with the body never read (or parsed), the throttle counting it as any wrong
        password; a proven one is handed on to :meth:`answer` rather than proven twice."""
        if request.method != "POST":
            return None, None
        try:
            declared = request.header("content-length")
            size = int(declared) if declared and declared.isdigit() else 0
            head = self._head(request.headers, size)
            route = await self._authenticated(head.login, request.peer)
        except Exception as exc:  # answered as answer() would answer it
            reply = _failure(exc)
            return HttpReply(reply.status, reply.body, reply.headers), None
        return None, _Proven(head.login, route)

    async def handle(self, request: HttpRequest) -> HttpReply:
        """The HTTP door's call, for any method to ``/sql``."""
        if request.method == "POST":
            proven = request.ticket if isinstance(request.ticket, _Proven) else None
            reply = await self.answer(request.headers, request.body, request.peer, proven)
        elif request.method == "OPTIONS":
            reply = Reply(200, b"", _PREFLIGHT)
        else:
            reply = _error(MethodNotAllowed("/sql takes POST (and OPTIONS, a CORS preflight)"))
            reply.headers.append(("Allow", "OPTIONS, POST"))
        return HttpReply(reply.status, reply.body, reply.headers)

    def _head(self, headers: Iterable[tuple[str, str]], size: int) -> Head:
        return parse_head(
            headers_of(headers),
            size,
            proxy_host=self._sessions.proxy_host,
            max_body=self._limits.request_bytes,
        )

    async def answer(
        self,
        headers: Iterable[tuple[str, str]],
        body: bytes,
        peer: str,
        proven: _Proven | None = None,
    ) -> Reply:
        """Answer one ``POST /sql``; ``peer`` is the client's address (its host); ``proven``:
        its login, proven already from its head (by :meth:`check`)."""
        try:
            head = self._head(headers, len(body))
            if proven is not None and proven.login == head.login:
                route = proven.route
            else:
                route = await self._authenticated(head.login, peer)
            # The body read once its sender is known, off the loop when large: every door of
            # every account is served meanwhile.
            if len(body) > _READ_ON_LOOP:
                request = await asyncio.to_thread(parse_body, head, body)
            else:
                request = parse_body(head, body)
            answer = await self._answer(request, route)
        except Exception as exc:  # every failure is an answer
            return _failure(exc)
        return Reply(200, answer.encode(), [_ANY_ORIGIN, *_batch_headers(request)])

    async def _authenticated(self, login: Login, peer: str) -> Route:
        try:
            return await self._sessions.check_password(
                login.endpoint_id, login.role, login.password, peer=peer
            )
        except scram.ScramError as exc:
            said = str(exc)
            fields = {"code": wire.INVALID_PASSWORD, "severity": "FATAL"}
            if hint := wire.hint_for(said):
                fields["hint"] = hint
            raise SqlFailed(said, fields) from None

    async def _answer(self, request: SqlRequest, route: Route) -> str:
        login = request.login
        activity = self._sessions.activity
        session = activity.open(login.endpoint_id, clock.now_us())
        try:
            return await self._run(request, route)
        finally:
            session.ticks += 1
            activity.close(session, clock.now_us())

    async def _run(self, request: SqlRequest, route: Route) -> str:
        login = request.login
        key: Key = (login.endpoint_id, login.role, login.database, login.params)
        # A pooled connection found closed (its compute suspended), or whose reset failed, ran
        # nothing of the request: it is replaced once, by a new one.
        for attempt in range(2):
            conn = await self._connection(request, key, route, fresh=attempt > 0 or route.fresh)
            reusable = False
            try:
                outcome = await execute(
                    conn.side,
                    request,
                    self._limits,
                    cancel=functools.partial(self._cancel, conn),
                    reset_first=conn.dirty,
                )
            except Stale:
                if attempt:
                    raise SqlFailed(
                        f"endpoint {login.endpoint_id} closed the connection; retry",
                        {"code": wire.CONNECTION_FAILURE},
                    ) from None
            except (Closed, ConnectionError, messages.MalformedMessage):
                raise SqlFailed(
                    f"endpoint {login.endpoint_id} closed the connection while the query ran",
                    {"code": wire.CONNECTION_FAILURE},
                ) from None
            except Exception as exc:
                error, reusable = unwrap(exc)
                reusable = reusable and request.pooled
                if error is exc:
                    raise
                raise error from None
            else:
                reusable = outcome.reusable and request.pooled
                return outcome.body
            finally:
                self._pool.release(conn, reusable=reusable)
        raise AssertionError("unreachable")

    async def _connection(
        self, request: SqlRequest, key: Key, route: Route, *, fresh: bool
    ) -> Conn:
        fresh = fresh or not request.pooled
        conn = await self._pool.acquire(
            key, wait=self._limits.seconds, fresh=fresh, account=route.account
        )
        if conn is not None:
            return conn
        login = request.login
        params = {"user": login.role, "database": login.database, "client_encoding": "UTF8"}
        startup = wire.Startup(wire.PROTOCOL_3, {**params, **dict(login.params)})
        try:
            side, target, reply = await self._sessions.open(login.endpoint_id, startup, route)
        except BaseException:
            self._pool.forfeit(key)
            raise
        cancel_key, refusal = messages.login_reply(reply)
        if refusal is not None:  # Postgres' own "no" (a database that does not exist...)
            side.close()
            self._pool.forfeit(key)
            fields = wire.error_fields(refusal)
            raise SqlFailed(fields.get("M", "login refused"), render.error_fields(fields))
        return self._pool.adopt(key, side, target, cancel_key)

    async def _cancel(self, conn: Conn) -> None:
        """Ask the compute to cancel what runs on ``conn``, as a client's CancelRequest would."""
        if conn.cancel_key is None:
            return
        pid, secret = conn.cancel_key
        with contextlib.suppress(OSError, Closed, TimeoutError, Unreachable, RouteError):
            async with asyncio.timeout(_CANCEL_SECONDS):
                await self._sessions.cancel_on(conn.target, pid, secret)


def _failure(exc: Exception) -> Reply:
    """A request's failure as its answer (called while ``exc`` is handled)."""
    if isinstance(exc, RouteError):
        return _error(SqlFailed(exc.message, {"code": exc.code, "severity": exc.severity}))
    if isinstance(exc, PgplaneError):
        return _error(exc)
    log.exception("SQL over HTTP request failed")
    return _error(PgplaneError("internal proxy error"))


def _error(exc: PgplaneError) -> Reply:
    fields = exc.fields if isinstance(exc, SqlFailed) else {}
    return Reply(exc.status, render.error_body(exc.message, fields), [_ANY_ORIGIN])


def _batch_headers(request: SqlRequest) -> list[tuple[str, str]]:
    """What a batch ran with, echoed as Neon's proxy echoes it."""
    batch = request.batch
    if batch is None:
        return []
    out = []
    if batch.isolation:
        words = {v: k for k, v in ISOLATION_LEVELS.items()}
        out.append((ISOLATION, words[batch.isolation]))
    if batch.read_only:
        out.append((READ_ONLY, "true"))
    if batch.deferrable:
        out.append((DEFERRABLE, "true"))
    return out
