"""The receivers of :mod:`.streaming`: one thread per running read-write compute, a physical
replication client over the compute's socket, storing what arrives as the branch's pieces.

A receiver's blocking libpq calls go through psycopg's ``pq`` layer (psycopg 3.3 takes
COPY BOTH; no second driver). What it reads is the tenant's (it may hold the compute's OS user
and answer in Postgres' place): every message is bounded and checked to continue the stream,
and what is stored goes under the branch's own prefix only.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import select
import struct
import threading
import time
from collections.abc import Callable
from pathlib import Path

from psycopg import pq
from psycopg.conninfo import make_conninfo
from psycopg.pq.abc import PGconn

from pgplane.compute.local.history.replay import format_lsn
from pgplane.compute.local.history.wal import parse_lsn, segment_bytes, segment_name
from pgplane.compute.local.shared.objects import ObjectStore
from pgplane.compute.local.shared.streaming import piece_key, stored_end

log = logging.getLogger(__name__)

# The name a compute waits for in synchronous mode (synchronous_standby_names).
STANDBY_NAME = "pgplane_archive"
# The most WAL a receiver's slot holds on its compute (max_slot_wal_keep_size): as much as a
# checkpoint cycle writes by default (max_wal_size), so a receiver behind by more is as rare.
SLOT_KEEP = "1GB"
# When the receiver stores what it received in asynchronous mode.
_ASYNC_SECONDS = 0.5
_ASYNC_BYTES = 4 << 20
# How long an asynchronous receiver lets WAL gather before it reads again, and how long a
# read drains the socket at most.
_COALESCE_SECONDS = 0.05
_DRAIN_SECONDS = 0.1
# Postgres sends at most 128 KiB of WAL a message; anything much larger is not Postgres.
_MAX_MESSAGE = 1 << 20
# How often the receiver tells the compute it is there (wal_sender_timeout is 60 s).
_STATUS_SECONDS = 10.0
_CONNECT_SECONDS = 5
# A receiver that ended is not started again for this long (a store or compute in trouble).
_RETRY_SECONDS = 1.0
# How often a synchronous receiver asks whether its branch has a base state there yet.
_BASE_CHECK_SECONDS = 0.25
_EPOCH_2000 = 946_684_800


class StreamError(Exception):
    """The stream cannot go on (the compute ended it, or said something Postgres does not)."""


def status_message(flushed: int, received: int, *, synchronous: bool) -> bytes:
    """A standby status update: in synchronous mode every position is what is stored; else
    what was received is written and flushed (no commit waits for an asynchronous standby,
    and a shutdown waits for the receipt, as with ``pg_receivewal``). The flush position is
    what moves the stream's slot on: the compute keeps the WAL after it."""
    now = int((time.time() - _EPOCH_2000) * 1e6)
    if synchronous:
        return b"r" + struct.pack("!QQQqB", flushed, flushed, flushed, now, 0)
    return b"r" + struct.pack("!QQQqB", received, received, 0, now, 0)


class Receiver(threading.Thread):
    """One compute's stream, stored as it comes (a daemon thread: blocking calls, bounded)."""

    def __init__(
        self,
        *,
        store: ObjectStore,
        prefix: str,
        conninfo: str,
        synchronous: bool,
        shipped: Callable[[], list[str]],
        based: Callable[[], bool],
    ) -> None:
        super().__init__(name=f"pgplane-stream-{prefix.rsplit('/', 1)[-1]}", daemon=True)
        self.store = store
        self.prefix = prefix
        self.synchronous = synchronous
        self._conninfo = make_conninfo(
            conninfo,
            replication="true",
            application_name=STANDBY_NAME,
            connect_timeout=_CONNECT_SECONDS,
        )
        self._shipped = shipped
        self._has_base = based
        # Synchronous mode acknowledges no commit before the branch has a base state on shared
        # storage: its WAL alone rebuilds nothing (a new branch's first round ships one).
        self._based = not synchronous
        self._base_checked = 0.0
        self.stopping = threading.Event()
        self.ended_at: float | None = None
        self.error: str | None = None  # why it ended, unless asked to
        # What was received and not yet stored: from this LSN.
        self._pending = bytearray()
        self._pending_at = 0
        self._first_pending = 0.0
        self.stored = 0  # the LSN up to which the object store holds the stream
        self.stored_time = 0.0  # when it last grew (time.time())
        self._timeline = 0
        self._segment_size = 0

    def run(self) -> None:
        try:
            self._session()
        except Exception as exc:  # a thread's end, said (the next round starts another)
            if not self.stopping.is_set():
                self.error = str(exc)
        finally:
            self.ended_at = time.monotonic()

    def _session(self) -> None:
        conn = pq.PGconn.connect(self._conninfo.encode())
        try:
            if conn.status != pq.ConnStatus.OK:
                raise StreamError(conn.get_error_message())
            self._stream(conn)
        finally:
            conn.finish()

    def _command(self, conn: PGconn, command: str) -> list[list[str]]:
        result = conn.exec_(command.encode())
        if result.status != pq.ExecStatus.TUPLES_OK:
            raise StreamError(f"{command}: {conn.get_error_message()}")
        rows = []
        for row in range(min(result.ntuples, 10)):
            values = [result.get_value(row, col) for col in range(min(result.nfields, 10))]
            rows.append([(v or b"").decode(errors="replace")[:200] for v in values])
        return rows

    def _stream(self, conn: PGconn) -> None:
        identity = self._command(conn, "IDENTIFY_SYSTEM")
        size = self._command(conn, "SHOW wal_segment_size")
        try:
            self._timeline = int(identity[0][1])
            position = parse_lsn(identity[0][2])
            self._segment_size = segment_bytes(size[0][0])
        except (IndexError, ValueError) as exc:
            raise StreamError(f"an answer Postgres does not give: {exc}") from None
        start = stored_end(
            self.store, self.prefix, self._shipped(), self._segment_size, self._timeline
        )
        if not 0 < start <= position:
            start = position - position % self._segment_size
        slot = self._slot(conn)
        where = f"{format_lsn(start)} TIMELINE {self._timeline}"
        conn.send_query(f"START_REPLICATION {slot}PHYSICAL {where}".encode())
        result = conn.get_result()
        if result is None or result.status != pq.ExecStatus.COPY_BOTH:
            raise StreamError(f"the stream did not start: {conn.get_error_message()}")
        self._pending_at = self.stored = start
        log.info("streaming the WAL of %s from %s", self.prefix, format_lsn(start))
        conn.nonblocking = 1
        last_status = 0.0
        while not self.stopping.is_set():
            reply = self._read(conn)
            now = time.monotonic()
            if self._pending and (
                self.synchronous
                or len(self._pending) >= _ASYNC_BYTES
                or now - self._first_pending >= _ASYNC_SECONDS
            ):
                self._store()
                reply = True  # the commits waiting, or the slot, move on now
            if not self._based and now - self._base_checked >= _BASE_CHECK_SECONDS:
                self._base_checked = now
                self._based = self._has_base()
                reply = reply or self._based  # the commits waited for it
            if reply or now - last_status >= _STATUS_SECONDS:
                stored = self.stored if self._based else 0
                self._send(
                    conn, status_message(stored, self._received, synchronous=self.synchronous)
                )
                last_status = now
            elif self._pending and not self.synchronous:
                # Nothing waits for it: what comes meanwhile is taken at once, not a wakeup
                # per commit (one at every flush of the compute's WAL, hundreds a second).
                self.stopping.wait(_COALESCE_SECONDS)

    def _slot(self, conn: PGconn) -> str:
        """A temporary slot for this stream ("SLOT name " to start it with), so that a
        checkpoint keeps the WAL the receiver has not taken yet: one that falls behind a bulk
        load would otherwise find it recycled, and wait for whole segments. Temporary: it
        ends with the connection, and a copy of the data directory never carries it (nor the
        WAL it would hold). How much it may hold is bounded by the compute's
        ``max_slot_wal_keep_size``. Without a free slot (the tenant's may take them all) the
        stream goes on without one, as before."""
        name = f"{STANDBY_NAME}_{secrets.token_hex(4)}"
        try:
            self._command(conn, f"CREATE_REPLICATION_SLOT {name} TEMPORARY PHYSICAL RESERVE_WAL")
        except StreamError as exc:
            log.info("the WAL stream of %s has no slot: %s", self.prefix, exc)
            return ""
        return f"SLOT {name} "

    @property
    def _received(self) -> int:
        return self._pending_at + len(self._pending)

    def _read(self, conn: PGconn) -> bool:
        """What arrived taken in (waiting a moment for it); whether a reply was asked for.

        What libpq holds already is taken first: the socket says nothing of it. (The error
        of a stream that cannot start, its WAL removed from the compute, arrives with the
        answer to START_REPLICATION: a wait on the socket first waited for ever, the compute's
        synchronous commits with it.)"""
        reply = False
        waited = False
        until = time.monotonic() + _DRAIN_SECONDS
        while True:
            got, data = conn.get_copy_data(1)
            if got == 0:
                # Once something came, what is there already: the socket drained (libpq reads
                # a buffer at a time, a message of 128 KiB takes several), within bounds (a
                # sender that never pauses must not keep the receiver from storing).
                if waited and (
                    reply or len(self._pending) >= _ASYNC_BYTES or time.monotonic() > until
                ):
                    return reply
                wait = 0.0 if waited else _ASYNC_SECONDS / 5 if self._pending else 1.0
                readable, _, _ = select.select([conn.socket], [], [], wait)
                if not readable:
                    return reply
                conn.consume_input()
                waited = True
                continue
            if got < 0:
                if self._pending:
                    self._store()
                raise StreamError(_why_ended(conn))
            if got > _MAX_MESSAGE + 64:
                raise StreamError(f"a message of {got} bytes")
            reply = self._message(bytes(data)) or reply

    def _message(self, data: bytes) -> bool:
        kind = data[:1]
        if kind == b"w" and len(data) >= 25:
            start, _, _ = struct.unpack_from("!QQq", data, 1)
            if start != self._received:
                raise StreamError(
                    f"WAL at {format_lsn(start)}, {format_lsn(self._received)} expected"
                )
            if not self._pending:
                self._first_pending = time.monotonic()
            self._pending += data[25:]
            return False
        if kind == b"k" and len(data) >= 18:
            return data[17] == 1
        raise StreamError(f"a message Postgres does not send ({kind!r}, {len(data)} bytes)")

    def _store(self) -> None:
        """What is pending stored, a piece per segment it touches."""
        at, data = self._pending_at, memoryview(bytes(self._pending))
        size = self._segment_size
        while data:
            offset = at % size
            take = min(len(data), size - offset)
            name = segment_name(self._timeline, at // size, size)
            key = piece_key(self.prefix, name, offset, offset + take)
            self.store.write_bytes(key, bytes(data[:take]))
            at += take
            data = data[take:]
        self._pending.clear()
        self._pending_at = self.stored = at
        self.stored_time = time.time()

    def _send(self, conn: PGconn, message: bytes) -> None:
        if conn.put_copy_data(message) != 1:
            raise StreamError(conn.get_error_message())
        deadline = time.monotonic() + _CONNECT_SECONDS
        while conn.flush() != 0:
            if time.monotonic() > deadline:
                raise StreamError("the compute takes no status")
            select.select([], [conn.socket], [], 0.1)


def _why_ended(conn: PGconn) -> str:
    """The compute's error that ended the stream (its result, which libpq holds by now: the
    connection's own message is empty until it is taken)."""
    result = conn.get_result()
    said = result.error_message.decode(errors="replace").strip() if result is not None else ""
    return said or conn.get_error_message() or "the compute ended the stream"


class Streams:
    """The receivers of this node's running computes, by data directory."""

    def __init__(
        self,
        store: ObjectStore,
        *,
        synchronous: bool,
        prefix_of: Callable[[str, str], str],
        shipped: Callable[[str], list[str]],
        based: Callable[[str], bool],
    ) -> None:
        self.store = store
        self.synchronous = synchronous
        self._prefix_of = prefix_of
        self._shipped = shipped
        self._based = based
        self._receivers: dict[Path, tuple[str, Receiver]] = {}
        self._said: dict[Path, str | None] = {}
        self._lock = threading.Lock()

    def ensure(self, pgdata: Path, project_id: str, branch_id: str, conninfo: str) -> None:
        """A receiver for the branch's compute that ``conninfo`` reaches, unless one streams
        it already (or one ended a moment ago: it is tried again at the next call)."""
        prefix = self._prefix_of(project_id, branch_id)
        with self._lock:
            current = self._receivers.get(pgdata)
            if current is not None:
                info, receiver = current
                if receiver.is_alive() and info == conninfo:
                    return
                receiver.stopping.set()
                ended = receiver.ended_at
                if ended is not None and time.monotonic() - ended < _RETRY_SECONDS:
                    return
                # Said once for as long as it ends the same way (a store down for an hour
                # would otherwise say so every second).
                if receiver.error is not None and receiver.error != self._said.get(pgdata):
                    log.warning("the WAL stream of %s ended: %s", prefix, receiver.error)
                self._said[pgdata] = receiver.error
            receiver = Receiver(
                store=self.store,
                prefix=prefix,
                conninfo=conninfo,
                synchronous=self.synchronous,
                shipped=lambda: self._shipped(prefix),
                based=lambda: self._based(prefix),
            )
            self._receivers[pgdata] = (conninfo, receiver)
            receiver.start()

    def forget(self, pgdata: Path) -> None:
        """The compute on ``pgdata`` stopped: its receiver stops (if it has not already)."""
        with self._lock:
            current = self._receivers.pop(pgdata, None)
            self._said.pop(pgdata, None)
        if current is not None:
            current[1].stopping.set()

    def stored(self, pgdata: Path) -> tuple[int, float] | None:
        """Where the compute's stored stream ends (LSN) and when it last grew."""
        current = self._receivers.get(pgdata)
        if current is None or not current[1].stored_time:
            return None
        return current[1].stored, current[1].stored_time

    def stop_all(self) -> None:
        with self._lock:
            receivers = [r for _, r in self._receivers.values()]
            self._receivers.clear()
        for receiver in receivers:
            receiver.stopping.set()
        for receiver in receivers:
            with contextlib.suppress(RuntimeError):
                receiver.join(timeout=2)
