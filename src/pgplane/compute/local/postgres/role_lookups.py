"""The proxy's lookups of roles made with SQL, over one session per running compute.

A login naming a role the platform has not seen is answered from the running compute, before
the client proved anything (see :mod:`pgplane.compute.local.postgres.verifiers`). A session
opened for each such login let anyone who knows an endpoint id open superuser sessions on it as
fast as it could dial, and take connection slots from its owner. Here each compute has one
session for these lookups, opened at the first and kept while they come (closed after
``idle_seconds`` without one, or when it breaks: a compute stopped, restarted, or its session
ended), so a stranger's flood of made-up roles opens nothing more: the lookups wait their turn
on it, each a query of the catalog.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

from pgplane.compute.driver import ComputeError
from pgplane.compute.local.postgres.sessions import Conn, admin_conninfo, connect
from pgplane.compute.local.postgres.verifiers import SQL_TIMEOUT, query_verifiers

IDLE_SECONDS = 30.0


@dataclass(slots=True)
class _Session:
    turn: asyncio.Lock = field(default_factory=asyncio.Lock)
    conn: Conn | None = None
    idle: asyncio.TimerHandle | None = None


class RoleLookups:
    def __init__(self, idle_seconds: float = IDLE_SECONDS) -> None:
        self._idle_seconds = idle_seconds
        self._sessions: dict[tuple[Path, int], _Session] = {}
        self._closing: set[asyncio.Task[None]] = set()

    async def read(self, socket_dir: Path, port: int, names: Sequence[str]) -> Mapping[str, str]:
        """name → verifier of those of ``names`` the compute holds (as ``read_verifiers``)."""
        key = (socket_dir, port)
        session = self._sessions.setdefault(key, _Session())
        async with session.turn:
            if session.idle is not None:
                session.idle.cancel()
            try:
                return await self._lookup(session, key, names)
            finally:
                # Kept a while for the next lookup; a broken one is dropped at once.
                delay = self._idle_seconds if session.conn is not None else 0
                loop = asyncio.get_running_loop()
                session.idle = loop.call_later(delay, self._expire, key, session)

    async def _lookup(
        self, session: _Session, key: tuple[Path, int], names: Sequence[str]
    ) -> Mapping[str, str]:
        try:
            # A kept session may have ended since (the compute restarted): one more try.
            if session.conn is not None:
                try:
                    return await self._query(session, key, names)
                except (psycopg.OperationalError, psycopg.InterfaceError):
                    await _close(session)
            return await self._query(session, key, names)
        except TimeoutError:
            await _close(session)
            raise ComputeError("reading the compute's roles timed out") from None
        except psycopg.Error as exc:
            await _close(session)
            raise ComputeError(f"reading the compute's roles: {exc}") from exc

    async def _query(
        self, session: _Session, key: tuple[Path, int], names: Sequence[str]
    ) -> Mapping[str, str]:
        async with asyncio.timeout(SQL_TIMEOUT):
            if session.conn is None:
                session.conn = await connect(admin_conninfo(*key))
            return await query_verifiers(session.conn, names)

    def _expire(self, key: tuple[Path, int], session: _Session) -> None:
        if session.turn.locked():
            return  # in use again: its lookup sets a new timer when done
        if self._sessions.get(key) is session:
            del self._sessions[key]
        task = asyncio.ensure_future(_close(session))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def forget(self, socket_dir: Path) -> None:
        """Close the sessions to computes on ``socket_dir`` (being stopped)."""
        for key in [k for k in self._sessions if k[0] == socket_dir]:
            session = self._sessions.pop(key)
            if session.idle is not None:
                session.idle.cancel()
            async with session.turn:
                await _close(session)

    async def close(self) -> None:
        for socket_dir in {key[0] for key in self._sessions}:
            await self.forget(socket_dir)
        await asyncio.gather(*self._closing, return_exceptions=True)


async def _close(session: _Session) -> None:
    conn, session.conn = session.conn, None
    if conn is not None:
        with contextlib.suppress(psycopg.Error, OSError):
            await conn.close()
