"""The streamed WAL's pieces in a store: where the copy ends, which pieces a round keeps, and
the segments a rebuild makes of them (contiguous from each segment's start, gaps ending them)."""

from __future__ import annotations

import hashlib
import os
import struct
from pathlib import Path

import pytest

from pgplane.compute.local.history import wal
from pgplane.compute.local.shared import receiver, streaming
from pgplane.compute.local.shared.objects import DirectoryStore

SEGMENT = 1 << 16  # small segments keep the files small; the names work the same
PREFIX = "history/p/b"


def _put(store: DirectoryStore, segment: str, start: int, data: bytes) -> None:
    store.write_bytes(streaming.piece_key(PREFIX, segment, start, start + len(data)), data)


def _name(segno: int, timeline: int = 1) -> str:
    return wal.segment_name(timeline, segno, SEGMENT)


@pytest.fixture
def store(tmp_path: Path) -> DirectoryStore:
    return DirectoryStore(tmp_path / "store")


def test_a_segment_is_rebuilt_from_contiguous_pieces_and_a_gap_ends_it(
    store: DirectoryStore, tmp_path: Path
) -> None:
    whole = os.urandom(SEGMENT)
    _put(store, _name(5), 0, whole[:1000])
    _put(store, _name(5), 1000, whole[1000:SEGMENT])
    _put(store, _name(6), 0, b"a" * 100)
    _put(store, _name(6), 100, b"b" * 50)
    _put(store, _name(6), 300, b"c" * 10)  # past a gap: never used
    _put(store, _name(8), 0, b"d" * 10)  # segment 7 is missing: never used
    dest = tmp_path / "wal"
    dest.mkdir()
    owner = (os.getuid(), os.getgid())
    made = streaming.assemble(
        store, PREFIX, after=_name(4)[8:], segment_size=SEGMENT, dest=dest, owner=owner
    )
    assert sorted(made) == [_name(5), _name(6)]
    assert (dest / _name(5)).read_bytes() == whole
    partial = (dest / _name(6)).read_bytes()
    assert partial == b"a" * 100 + b"b" * 50 + bytes(SEGMENT - 150)
    assert made[_name(6)] == hashlib.sha256(partial).hexdigest()
    # Where the copy ends: segment 6's start, and the 150 bytes contiguous there.
    assert streaming.stored_end(store, PREFIX, [_name(4)], SEGMENT) == 6 * SEGMENT + 150
    # Nothing shipped: the pieces from the first one streamed.
    assert streaming.stored_end(store, PREFIX, [], SEGMENT) == 6 * SEGMENT + 150
    # Segment 5 shipped whole: its pieces are stale, segment 6's live.
    keys = store.sizes(PREFIX)
    live = {k for k in keys if streaming.live(k, PREFIX, _name(5)[8:])}
    assert live == {k for k in keys if f"/{_name(6)}/" in k or f"/{_name(8)}/" in k}


def test_overlapping_pieces_of_two_receivers_and_a_newer_timeline(
    store: DirectoryStore, tmp_path: Path
) -> None:
    """A receiver started again streams its segment from where the store's copy ends, or from
    the segment's start: overlapping pieces hold the same bytes; after a promotion the newer
    timeline's segment of a number is the one used."""
    data = os.urandom(3000)
    _put(store, _name(3), 0, data[:2000])
    _put(store, _name(3), 0, data[:1500])
    _put(store, _name(3), 1500, data[1500:3000])
    _put(store, _name(3, timeline=2), 0, b"x" * 10)
    dest = tmp_path / "wal"
    dest.mkdir()
    made = streaming.assemble(
        store,
        PREFIX,
        after=_name(2)[8:],
        segment_size=SEGMENT,
        dest=dest,
        owner=(os.getuid(), os.getgid()),
    )
    assert list(made) == [_name(3, timeline=2)]
    # A receiver on timeline 1 or 2 counts only its own timeline's WAL as stored.
    assert streaming.stored_end(store, PREFIX, [_name(2)], SEGMENT, 1) == 3 * SEGMENT + 3000
    assert streaming.stored_end(store, PREFIX, [_name(2)], SEGMENT, 2) == 3 * SEGMENT + 10
    assert streaming.stored_end(store, PREFIX, [_name(2)], SEGMENT, 3) == 0
    store.delete(streaming.piece_key(PREFIX, _name(3, timeline=2), 0, 10))
    made = streaming.assemble(
        store,
        PREFIX,
        after=_name(2)[8:],
        segment_size=SEGMENT,
        dest=dest,
        owner=(os.getuid(), os.getgid()),
    )
    assert (dest / _name(3)).read_bytes()[:3000] == data


def test_status_updates_say_stored_only_in_synchronous_mode() -> None:
    sync = receiver.status_message(0x100, 0x200, synchronous=True)
    assert sync[:1] == b"r" and struct.unpack_from("!QQQ", sync, 1) == (0x100, 0x100, 0x100)
    later = receiver.status_message(0x100, 0x200, synchronous=False)
    # What was received, as written and flushed: the slot moves on with it, no commit waits,
    # and a shutdown waits for the receipt alone.
    assert struct.unpack_from("!QQQ", later, 1) == (0x200, 0x200, 0)


def test_a_stream_that_does_not_continue_is_refused(store: DirectoryStore) -> None:
    stream = receiver.Receiver(
        store=store,
        prefix=PREFIX,
        conninfo="host=/nonexistent",
        synchronous=True,
        shipped=list,
        based=lambda: True,
    )
    header = struct.pack("!QQq", 0, 0, 0)
    assert stream._message(b"w" + header + b"wal") is False
    with pytest.raises(receiver.StreamError, match="expected"):
        stream._message(b"w" + struct.pack("!QQq", 100, 0, 0) + b"elsewhere")
    with pytest.raises(receiver.StreamError, match="does not send"):
        stream._message(b"Z" * 40)
    assert stream._message(b"k" + struct.pack("!QqB", 0, 0, 1)) is True
