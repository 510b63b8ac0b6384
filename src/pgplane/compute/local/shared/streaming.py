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

The receivers that write them are in :mod:`.receiver`. Two modes:

- asynchronous (the default): what arrived is stored at least every half second (sooner past
  4 MiB); the receiver reports what it received as flushed, so no commit waits for it (a
  shutdown waits for what was sent to be received, as with ``pg_receivewal``);
- synchronous (``--archive-sync``): the compute names the receiver in
  ``synchronous_standby_names``, and the receiver reports a position flushed only once the WAL
  up to it is in the object store. A commit is acknowledged to its client only then: what the
  loss of the machine loses is nothing acknowledged. The price is a request's round trip per
  commit (commits waiting together share one), and while the store does not answer, commits
  wait (reads go on), as they do on Neon while its safekeepers cannot take WAL.

A receiver starts where the object store's copy of the branch's WAL ends (the newest shipped
segment's end, then the pieces streamed after it): nothing is acknowledged that is not there,
even after the platform's restart. Each holds a temporary replication slot, so the compute
keeps the WAL it has not taken yet (up to ``max_slot_wal_keep_size``): one behind a bulk load
goes on from where it was instead of waiting for whole segments. What a receiver reads is the
tenant's (it may hold the compute's OS user and answer in Postgres' place): every message is
bounded and checked to continue the stream, and what is stored goes under the branch's own
prefix only.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from pgplane.compute.driver import ComputeError
from pgplane.compute.local.files import write_owned
from pgplane.compute.local.shared.objects import ObjectStore

_STREAM = "stream"
_PIECE = re.compile(r"([0-9A-F]{24})/([0-9A-F]{8})-([0-9A-F]{8})")


class Freed(Exception):
    """A piece listed was gone when read: its segment was shipped whole meanwhile, and the
    round that listed the branch next freed it (a rebuild beside the running platform, as
    ``backups verify`` is, reads the pieces while they may go)."""


def piece_key(prefix: str, segment: str, start: int, end: int) -> str:
    return f"{prefix}/{_STREAM}/{segment}/{start:08X}-{end:08X}"


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
    sha256. Raises Freed when a piece went while they were read (ask the head again)."""
    made: dict[str, str] = {}
    for name, used, _ in _following(store, prefix, after, segment_size):
        data = bytearray(segment_size)
        for start, stop, key in used:
            try:
                # safe: sealed under its name (a forged or moved one fails to open), bounded
                body = store.read_bytes(key, max_bytes=stop - start)
            except FileNotFoundError:
                raise Freed(key) from None
            if len(body) != stop - start:
                raise ComputeError(f"streamed WAL {key.rsplit('/', 2)[-2]} is cut short")
            data[start:stop] = body
        made[name] = _write_segment(dest / name, bytes(data), owner)
    return made


def _write_segment(path: Path, data: bytes, owner: tuple[int, int]) -> str:
    write_owned(path, lambda out: out.write(data), owner)
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
