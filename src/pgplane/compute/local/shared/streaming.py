"""Each running compute's WAL streamed to the object store as it is written, and read back.

Archiving ships a segment once it is complete (``shipping``); what a compute wrote since is
only on its disk. So the platform is also a replication client of each running read-write
compute (a physical stream over its socket, as ``cloud_admin``, whom the platform's
``pg_hba.conf`` trusts there for replication alone) and stores what it receives as it comes::

    history/<project_id>/<branch_id>/stream/<segment>/<start>-<end>    the WAL from <start>
                                                                         to <end> (hex) of
                                                                         <segment>

Each object is sealed under its own name (``sealed``): a tenant can neither forge one nor move
one to another offset or branch, so a rebuild trusts what it lists there without a head. Once
the segment is shipped whole, the next round that lists the branch frees its pieces
(``shipping._free``).

Two modes:

- asynchronous (the default): what arrived is stored at least every half second (sooner past
  4 MiB); the receiver reports nothing as flushed, so Postgres never waits for it (a shutdown
  waits for what was sent to be received, as with ``pg_receivewal``);
- synchronous (``--archive-sync``): the compute names the receiver in
  ``synchronous_standby_names``, and the receiver reports a position flushed only once the WAL
  up to it is in the object store. A commit is acknowledged to its client only then: what the
  loss of the machine loses is nothing acknowledged. The price is a request's round trip per
  commit (commits waiting together share one), and while the store does not answer, commits
  wait (reads go on), as they do on Neon while its safekeepers cannot take WAL.

A receiver starts where the object store's copy of the branch's WAL ends (the newest shipped
segment's end, then the pieces streamed after it): nothing is acknowledged that is not there,
even after the platform's restart. What a receiver reads is the tenant's (it may hold the
compute's OS user and answer in Postgres' place): every message is bounded and checked to
continue the stream, and what is stored goes under the branch's own prefix only.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
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

from pgplane.compute.driver import ComputeError
from pgplane.compute.local.shared.objects import ObjectStore

log = logging.getLogger(__name__)

# The name a compute waits for in synchronous mode (synchronous_standby_names).
STANDBY_NAME = "pgplane_archive"
_STREAM = "stream"
_PIECE = re.compile(r"([0-9A-F]{24})/([0-9A-F]{8})-([0-9A-F]{8})")
# When the receiver stores what it received in asynchronous mode.
_ASYNC_SECONDS = 0.5
_ASYNC_BYTES = 4 << 20
# Postgres sends at most 128 KiB of WAL a message; anything much larger is not Postgres.
_MAX_MESSAGE = 1 << 20
# How often the receiver tells the compute it is there (wal_sender_timeout is 60 s).
_STATUS_SECONDS = 10.0
_CONNECT_SECONDS = 5
# A receiver that ended is not started again for this long (a store or compute in trouble).
_RETRY_SECONDS = 1.0
_EPOCH_2000 = 946_684_800
_MAX_SEGMENT = 1 << 30


def piece_key(prefix: str, segment: str, start: int, end: int) -> str:
    return f"{prefix}/{_STREAM}/{segment}/{start:08X}-{end:08X}"


def segment_name(timeline: int, segno: int, segment_size: int) -> str:
    per_id = 0x1_0000_0000 // segment_size
    return f"{timeline:08X}{segno // per_id:08X}{segno % per_id:08X}"


def _segno(number: str, segment_size: int) -> int:
    """A segment's number from its name past the timeline (``name[8:]``)."""
    return int(number[:8], 16) * (0x1_0000_0000 // segment_size) + int(number[8:], 16)


def pieces(store: ObjectStore, prefix: str) -> dict[str, list[tuple[int, int, str]]]:
    """The branch's streamed pieces: by segment name, each piece's start, end and key."""
    found: dict[str, list[tuple[int, int, str]]] = {}
    start = f"{prefix}/{_STREAM}/"
    for key in store.sizes(f"{prefix}/{_STREAM}"):
        match = _PIECE.fullmatch(key[len(start) :])
        if match is not None and int(match.group(2), 16) < int(match.group(3), 16):
            piece = (int(match.group(2), 16), int(match.group(3), 16), key)
            found.setdefault(match.group(1), []).append(piece)
    return found


def live(key: str, prefix: str, shipped_end: str) -> bool:
    """Whether ``key`` is a streamed piece of a segment not yet shipped whole (``shipped_end``:
    the newest shipped segment's name past its timeline, as ``name[8:]``; "" when none is)."""
    start = f"{prefix}/{_STREAM}/"
    match = _PIECE.fullmatch(key[len(start) :]) if key.startswith(start) else None
    return match is not None and match.group(1)[8:] > shipped_end


def _following(
    store: ObjectStore, prefix: str, after: str, segment_size: int, timeline: str = ""
) -> list[tuple[str, list[tuple[int, int, str]], int]]:
    """The streamed segments past ``after`` (a segment name past its timeline; "": any), in
    order, each with the pieces that reach contiguously from its start and how far they
    reach: one after another, the first gap or partial segment the last. ``timeline`` (its
    8 hex digits): of that timeline only."""
    by_segment = pieces(store, prefix)
    # Of each segment number, the newest timeline's (a promotion's switch is in its history).
    newest: dict[str, str] = {}
    for name in by_segment:
        if not name.startswith(timeline):
            continue
        if name[8:] > after and name > newest.get(name[8:], ""):
            newest[name[8:]] = name
    found = []
    expected = after
    for number in sorted(newest):
        if expected and _segno(number, segment_size) != _segno(expected, segment_size) + 1:
            break
        used, end = [], 0
        for start, stop, key in sorted(by_segment[newest[number]]):
            if start > end or stop > segment_size:
                break
            if stop > end:
                used.append((start, stop, key))
                end = stop
        if end == 0:
            break
        found.append((newest[number], used, end))
        if end < segment_size:
            break
        expected = number
    return found


def assemble(
    store: ObjectStore,
    prefix: str,
    *,
    after: str,
    segment_size: int,
    dest: Path,
    owner: tuple[int, int],
) -> dict[str, str]:
    """The segments streamed past ``after`` rebuilt from their pieces into ``dest`` (each
    zero-filled to its size, as ``pg_receivewal`` leaves a partial one): by name, their
    sha256."""
    made: dict[str, str] = {}
    for name, used, _ in _following(store, prefix, after, segment_size):
        data = bytearray(segment_size)
        for start, stop, key in used:
            # safe: sealed under its name (a forged or moved one fails to open), bounded
            body = store.read_bytes(key, max_bytes=stop - start)
            if len(body) != stop - start:
                raise ComputeError(f"streamed WAL {key.rsplit('/', 2)[-2]} is cut short")
            data[start:stop] = body
        made[name] = _write_segment(dest / name, bytes(data), owner)
    return made


def _write_segment(path: Path, data: bytes, owner: tuple[int, int]) -> str:
    tmp = path.with_name(f".{path.name}.tmp-{secrets.token_hex(4)}")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        with open(os.open(tmp, flags, 0o600), "wb") as out:  # root's: made here, O_EXCL
            out.write(data)
            os.fchown(out.fileno(), *owner)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return hashlib.sha256(data).hexdigest()


def stored_end(
    store: ObjectStore, prefix: str, shipped: list[str], segment_size: int, timeline: int = 0
) -> int:
    """Where the object store's copy of the branch's WAL ends (an LSN; 0 when it holds
    none): the newest shipped segment's end, then the pieces streamed after it. ``timeline``:
    on that timeline only (after a restore or a promotion the WAL past the switch is another
    timeline's: a receiver never counts it as stored)."""
    named = f"{timeline:08X}" if timeline else ""
    after = max((n[8:] for n in shipped if n.startswith(named)), default="")
    end = 0 if not after else (_segno(after, segment_size) + 1) * segment_size
    for name, _, reach in _following(store, prefix, after, segment_size, named):
        end = _segno(name[8:], segment_size) * segment_size + reach
    return end


# -- the receiver ---------------------------------------------------------------------------


class StreamError(Exception):
    """The stream cannot go on (the compute ended it, or said something Postgres does not)."""


def _lsn(text: str) -> int:
    high, _, low = text.partition("/")
    return (int(high, 16) << 32) | int(low, 16)


def _lsn_text(lsn: int) -> str:
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


def status_message(flushed: int, received: int, *, synchronous: bool) -> bytes:
    """A standby status update: in synchronous mode every position is what is stored; else
    what was received is written and nothing is flushed (Postgres waits for nothing)."""
    now = int((time.time() - _EPOCH_2000) * 1e6)
    if synchronous:
        return b"r" + struct.pack("!QQQqB", flushed, flushed, flushed, now, 0)
    return b"r" + struct.pack("!QQQqB", received, 0, 0, now, 0)


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
            position = _lsn(identity[0][2])
            self._segment_size = _segment_bytes(size[0][0])
        except (IndexError, ValueError) as exc:
            raise StreamError(f"an answer Postgres does not give: {exc}") from None
        start = stored_end(
            self.store, self.prefix, self._shipped(), self._segment_size, self._timeline
        )
        if not 0 < start <= position:
            start = position - position % self._segment_size
        conn.send_query(
            f"START_REPLICATION PHYSICAL {_lsn_text(start)} TIMELINE {self._timeline}".encode()
        )
        result = conn.get_result()
        if result is None or result.status != pq.ExecStatus.COPY_BOTH:
            raise StreamError(f"the stream did not start: {conn.get_error_message()}")
        self._pending_at = self.stored = start
        log.info("streaming the WAL of %s from %s", self.prefix, _lsn_text(start))
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
                reply = self.synchronous or reply
            if reply or now - last_status >= _STATUS_SECONDS:
                self._send(
                    conn, status_message(self.stored, self._received, synchronous=self.synchronous)
                )
                last_status = now

    @property
    def _received(self) -> int:
        return self._pending_at + len(self._pending)

    def _read(self, conn: PGconn) -> bool:
        """What arrived taken in (waiting a moment for it); whether a reply was asked for."""
        wait = _ASYNC_SECONDS / 5 if self._pending else 1.0
        readable, _, _ = select.select([conn.socket], [], [], wait)
        if not readable:
            return False
        conn.consume_input()
        reply = False
        while True:
            got, data = conn.get_copy_data(1)
            if got == 0:
                return reply
            if got < 0:
                if self._pending:
                    self._store()
                raise StreamError(conn.get_error_message() or "the compute ended the stream")
            if got > _MAX_MESSAGE + 64:
                raise StreamError(f"a message of {got} bytes")
            reply = self._message(bytes(data)) or reply

    def _message(self, data: bytes) -> bool:
        kind = data[:1]
        if kind == b"w" and len(data) >= 25:
            start, _, _ = struct.unpack_from("!QQq", data, 1)
            if start != self._received:
                raise StreamError(
                    f"WAL at {_lsn_text(start)}, {_lsn_text(self._received)} expected"
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


def _segment_bytes(setting: str) -> int:
    units = {"kB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30}
    for unit, factor in units.items():
        if setting.endswith(unit):
            value = int(setting[: -len(unit)]) * factor
            break
    else:
        value = int(setting)
    if value <= 0 or value > _MAX_SEGMENT or value & (value - 1):
        raise ValueError(f"wal_segment_size {setting!r}")
    return value


class Streams:
    """The receivers of this node's running computes, by data directory."""

    def __init__(
        self,
        store: ObjectStore,
        *,
        synchronous: bool,
        prefix_of: Callable[[str, str], str],
        shipped: Callable[[str], list[str]],
    ) -> None:
        self.store = store
        self.synchronous = synchronous
        self._prefix_of = prefix_of
        self._shipped = shipped
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
