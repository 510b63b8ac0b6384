"""Logged-in compute connections kept between SQL over HTTP requests, bounded.

A query over HTTP would otherwise pay a Postgres backend start each time. Connections are kept
per (endpoint, role, database, startup parameters), and a request gives its connection back
only if it ended ready and idle in no transaction. It is idle again at once, marked
:attr:`Conn.dirty`: the next request on it resets the session first, in its own pipeline
(:mod:`pgplane.proxy.sqlhttp.reset`), so what one request set never reaches the next. One left
idle for ``settle_seconds`` is reset where it is, in the background, so what a request left (a
lock, say) does not outlive it for long; a request that finds none idle while one of its key is
being reset so waits for that one (a round trip on the compute) rather than starting a backend,
and a failed reset closes the connection.

Connections are dropped as soon as their compute closes them (a suspend stops it with a fast
shutdown, which ends every session), or sends anything while idle (a session's last words). A
kept connection is no reason to keep a compute awake: it is no proxy session
(:mod:`pgplane.proxy.activity` never hears of it) and Postgres shows it idle since its last
request, which is what idle suspend asks.

Bounds: so many connections per key (busy, being reset or idle), so many per account (a quarter
of all by default: one account's slow queries over many keys never hold every connection, and
another account's request is served beside them), so many in all; a request past them waits
for one to be given back, up to a deadline, then is refused. An idle connection of
another key is closed to make room, and one idle past ``idle_seconds`` is closed when next seen.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from pgplane.errors import SqlFailed
from pgplane.proxy import wire
from pgplane.proxy.pipe import Side
from pgplane.proxy.seam import Target
from pgplane.proxy.sqlhttp.reset import SETTLE_SECONDS, discard_all

Key = tuple[str, str, str, tuple[tuple[str, str], ...]]  # endpoint, role, database, parameters
# Starts putting an idle connection's session back as new, at once; what it returns is awaited
# in the background: True only once that is verified.
Reset = Callable[[Side], Coroutine[Any, Any, bool]]


@dataclass(eq=False, slots=True)
class Conn:
    key: Key
    side: Side
    target: Target
    cancel_key: tuple[int, bytes] | None
    idle_since: float = 0.0
    state: str = "busy"  # busy, resetting, idle or gone
    # A request ran on it since its last reset: the next one resets it first.
    dirty: bool = False


class Pool:
    def __init__(
        self,
        *,
        per_key: int = 10,
        total: int = 200,
        per_account: int | None = None,
        idle_seconds: float = 300.0,
        settle_seconds: float = SETTLE_SECONDS,
        reset: Reset = discard_all,
    ) -> None:
        self._per_key = per_key
        self._max_total = total
        self._per_account = per_account or max(per_key, total // 4)
        self._accounts: dict[Key, str] = {}  # each key with a slot open: its account's
        self._per_account_open: dict[str, int] = {}
        self._idle_seconds = idle_seconds
        self._settle_seconds = settle_seconds
        self._reset = reset
        self._sweep: asyncio.TimerHandle | None = None  # the next look for dirty idle ones
        self._idle: dict[Key, list[Conn]] = {}
        self._open: dict[Key, int] = {}  # busy, resetting, idle and being opened
        self._total = 0
        # Requests waiting, first come first: for a connection of their key (a key at its cap),
        # or (None) for any slot (their account's or all at their cap).
        self._waiters: list[tuple[Key | None, asyncio.Future[None]]] = []
        # Each reset under way: its task, and the reply's reading it awaits.
        self._resetting: dict[Conn, tuple[asyncio.Task[None], Coroutine[Any, Any, bool]]] = {}
        self._resetting_per_key: dict[Key, int] = {}
        self._claims: dict[Key, int] = {}  # requests waiting for a reset of their key

    def counts(self, key: Key) -> tuple[int, int]:
        """Connections open for ``key`` and of those idle (for tests and logs)."""
        return self._open.get(key, 0), len(self._idle.get(key, ()))

    async def acquire(
        self, key: Key, *, wait: float, fresh: bool = False, account: str = ""
    ) -> Conn | None:
        """An idle connection for ``key`` (never with ``fresh``); None: a slot is reserved,
        open one and :meth:`adopt` it (or :meth:`forfeit` the slot). Waits up to ``wait``
        seconds for a connection to be given back. ``account``: whose the key's endpoint is."""
        deadline = time.monotonic() + wait
        while True:
            now = time.monotonic()
            self._expire(now)
            conn = None if fresh else self._take_idle(key)
            if conn is not None:
                return conn
            left = deadline - now
            if not fresh and left > 0 and self._unclaimed_resets(key):
                # One being reset is ready within a round trip: cheaper than a new backend.
                self._claims[key] = self._claims.get(key, 0) + 1
                try:
                    await self._wait(left, key)
                finally:
                    self._count(self._claims, key, -1)
                continue
            if self._per_account_open.get(account, 0) >= self._per_account:
                self._evict_one(account)  # its own idle one, for its key that has none
            if (
                self._open.get(key, 0) < self._per_key
                and self._per_account_open.get(account, 0) < self._per_account
            ):
                if self._total >= self._max_total:
                    self._evict_one()
                if self._total < self._max_total:
                    self._open[key] = self._open.get(key, 0) + 1
                    self._accounts[key] = account
                    self._per_account_open[account] = self._per_account_open.get(account, 0) + 1
                    self._total += 1
                    return None
            if left <= 0:
                raise SqlFailed(
                    f"too many SQL over HTTP requests at once to endpoint {key[0]} as this role;"
                    " retry later",
                    {"code": wire.TOO_MANY_CONNECTIONS},
                )
            await self._wait(left, key if self._open.get(key, 0) >= self._per_key else None)

    def _take_idle(self, key: Key) -> Conn | None:
        idle = self._idle.get(key)
        while idle:
            conn = idle.pop()  # the most recent: the others age out when not needed
            if not idle:
                del self._idle[key]
            if conn.side.lost.done() or conn.side.unread():
                # Closed, or closing: an idle session speaks only to say it is ending.
                conn.state = "busy"
                self._forget(conn)
                continue
            conn.state = "busy"
            return conn
        return None

    def _unclaimed_resets(self, key: Key) -> bool:
        return self._resetting_per_key.get(key, 0) > self._claims.get(key, 0)

    async def _wait(self, seconds: float, key: Key | None = None) -> None:
        """Until a connection is given back or a slot freed (of ``key``, when given), or
        ``seconds`` pass.

        A connection or slot of a key wakes the first of that key's waiters only: waking all of
        them at each (64 requests of one account waiting on one key's ten connections, their
        queries ending together) ran hundreds of coroutines that found nothing, tens of
        milliseconds of the event loop in a burst, every other account's requests waiting."""
        entry = (key, asyncio.get_running_loop().create_future())
        self._waiters.append(entry)
        woken = False
        try:
            async with asyncio.timeout(seconds):
                await entry[1]
            woken = True
        except TimeoutError:
            pass
        finally:
            if entry in self._waiters:
                self._waiters.remove(entry)
            elif not woken and key is not None:
                # Woken for its key's connection but leaving without it (its time up or the
                # client gone meanwhile): the next waiter's turn, or the connection sits idle.
                self._wake(key)

    def adopt(
        self, key: Key, side: Side, target: Target, cancel_key: tuple[int, bytes] | None
    ) -> Conn:
        """A connection opened in a slot :meth:`acquire` reserved."""
        conn = Conn(key, side, target, cancel_key)
        side.lost.add_done_callback(lambda _: self._lost(conn))
        return conn

    def forfeit(self, key: Key) -> None:
        """Give back a slot whose connection could not be opened."""
        self._release_slot(key)

    def release(self, conn: Conn, *, reusable: bool) -> None:
        """Give ``conn`` back: closed unless ``reusable`` (ready and idle in no transaction);
        else idle at once, to be reset before its next request, or where it is if none comes
        within ``settle_seconds``."""
        if conn.state != "busy":
            return
        if not reusable or conn.side.lost.done():
            self._forget(conn)
            return
        conn.dirty = True
        self._put_idle(conn)
        if self._sweep is None:
            loop = asyncio.get_running_loop()
            self._sweep = loop.call_later(self._settle_seconds, self._reset_settled)

    def _put_idle(self, conn: Conn) -> None:
        conn.state = "idle"
        conn.idle_since = time.monotonic()
        self._idle.setdefault(conn.key, []).append(conn)
        self._wake(conn.key)

    def _reset_settled(self) -> None:
        """Reset every dirty connection idle for ``settle_seconds``; look again when the next
        one will have been."""
        self._sweep = None
        now = time.monotonic()
        due = [c for conns in self._idle.values() for c in conns if c.dirty]
        later = [c.idle_since for c in due if now - c.idle_since < self._settle_seconds]
        for conn in due:
            if now - conn.idle_since >= self._settle_seconds:
                self._reset_idle(conn)
        if later:
            wait = min(later) + self._settle_seconds - now
            self._sweep = asyncio.get_running_loop().call_later(wait, self._reset_settled)

    def _reset_idle(self, conn: Conn) -> None:
        idle = self._idle[conn.key]
        idle.remove(conn)
        if not idle:
            del self._idle[conn.key]
        conn.state = "resetting"
        self._count(self._resetting_per_key, conn.key, 1)
        try:
            verified = self._reset(conn.side)
        except Exception:
            self._count(self._resetting_per_key, conn.key, -1)
            self._forget(conn)
            return
        task = asyncio.get_running_loop().create_task(self._put_back(conn, verified))
        self._resetting[conn] = (task, verified)

    async def _put_back(self, conn: Conn, verified: Coroutine[Any, Any, bool]) -> None:
        clean = False
        try:
            clean = await verified
        except Exception:
            clean = False
        finally:
            self._resetting.pop(conn, None)
            if conn.state == "resetting":  # not closed meanwhile (the pool closes)
                self._count(self._resetting_per_key, conn.key, -1)
                if clean and not conn.side.lost.done():
                    conn.dirty = False
                    self._put_idle(conn)
                else:
                    self._forget(conn)

    async def settled(self) -> None:
        """Once every reset under way has ended (for tests)."""
        while self._resetting:
            tasks = [task for task, _ in self._resetting.values()]
            await asyncio.gather(*tasks, return_exceptions=True)

    async def reset_idle(self) -> None:
        """Reset every dirty idle connection now, as ``settle_seconds`` would, and wait for
        it (for tests)."""
        for conn in [c for conns in self._idle.values() for c in conns if c.dirty]:
            self._reset_idle(conn)
        await self.settled()

    def close(self) -> None:
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None
        for conn, (task, verified) in list(self._resetting.items()):
            task.cancel()
            if inspect.getcoroutinestate(verified) == inspect.CORO_CREATED:
                verified.close()  # its task is cancelled before it ever ran: never awaited
            self._count(self._resetting_per_key, conn.key, -1)
            self._forget(conn)
        self._resetting.clear()
        for conns in list(self._idle.values()):
            for conn in list(conns):
                self._forget(conn)

    @staticmethod
    def _count(counts: dict[Key, int], key: Key, change: int) -> None:
        left = counts.get(key, 0) + change
        if left > 0:
            counts[key] = left
        else:
            counts.pop(key, None)

    def _lost(self, conn: Conn) -> None:
        # The compute closed it (a suspend, a restart): an idle one leaves at once; a busy one
        # is dropped when its request gives it back.
        if conn.state == "idle":
            self._forget(conn)

    def _forget(self, conn: Conn) -> None:
        if conn.state == "gone":
            return
        if conn.state == "idle":
            idle = self._idle.get(conn.key, [])
            if conn in idle:
                idle.remove(conn)
            if not idle:
                self._idle.pop(conn.key, None)
        conn.state = "gone"
        conn.side.close()
        self._release_slot(conn.key)

    def _release_slot(self, key: Key) -> None:
        account = self._accounts[key]
        left = self._per_account_open[account] - 1
        if left > 0:
            self._per_account_open[account] = left
        else:
            del self._per_account_open[account]
        if self._open.get(key, 0) <= 1:
            del self._accounts[key]
        self._count(self._open, key, -1)
        self._total -= 1
        self._wake(key)

    def _expire(self, now: float) -> None:
        old = [
            conn
            for conns in self._idle.values()
            for conn in conns
            if now - conn.idle_since > self._idle_seconds
        ]
        for conn in old:
            self._forget(conn)

    def _evict_one(self, account: str | None = None) -> None:
        """The oldest idle connection closed (of ``account``'s keys, when given)."""
        oldest = min(
            (
                conns[0]
                for key, conns in self._idle.items()
                if conns and (account is None or self._accounts.get(key) == account)
            ),
            key=lambda c: c.idle_since,
            default=None,
        )
        if oldest is not None:
            self._forget(oldest)

    def _wake(self, key: Key) -> None:
        """What a connection or slot of ``key`` given back may serve: the first waiter of that
        key, and every waiter for any slot."""
        kept: list[tuple[Key | None, asyncio.Future[None]]] = []
        first = True
        for entry in self._waiters:
            waits_for, waiter = entry
            if waiter.done():
                continue
            if waits_for is None or (first and waits_for == key):
                first = first and waits_for != key
                waiter.set_result(None)
            else:
                kept.append(entry)
        self._waiters = kept
