"""Shared storage as a directory: objects whole or absent, and what is read back never trusted
(no link followed at any component, no FIFO waited on, every read bounded)."""

from __future__ import annotations

import io
import os
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

import pytest

from pgplane.compute.driver import ComputeError
from pgplane.compute.local.cold import archive
from pgplane.compute.local.history import wal
from pgplane.compute.local.history.archiving import Base, HistoryDirs
from pgplane.compute.local.history.bases import fresh_tmp, publish_base
from pgplane.compute.local.shared import cold, fetching, shipping, streaming
from pgplane.compute.local.shared.objects import DirectoryStore, Written


def test_objects_round_trip_with_their_checksums(tmp_path: Path) -> None:
    store = DirectoryStore(tmp_path / "shared")
    sent = store.write("history/p-1/b-1/wal/seg", io.BytesIO(b"x" * 5000), max_bytes=5000)
    sink = io.BytesIO()
    got = store.read("history/p-1/b-1/wal/seg", sink, max_bytes=5000)
    assert (got.size, got.sha256) == (sent.size, sent.sha256) == (5000, sent.sha256)
    assert sink.getvalue() == b"x" * 5000
    assert list(store.sizes("history/p-1")) == ["history/p-1/b-1/wal/seg"]
    assert (tmp_path / "shared").stat().st_mode & 0o777 == 0o700
    store.delete("history/p-1")
    assert list(store.sizes("history")) == []
    assert store.identity == DirectoryStore(tmp_path / "shared").identity


def test_a_read_is_bounded_and_a_write_too(tmp_path: Path) -> None:
    store = DirectoryStore(tmp_path)
    store.write_bytes("a/big", b"y" * 100)
    with pytest.raises(ComputeError, match="larger than 99"):
        store.read_bytes("a/big", max_bytes=99)
    with pytest.raises(ComputeError, match="more than 10"):
        store.write("a/other", io.BytesIO(b"z" * 11), max_bytes=10)
    assert not store.exists("a/other")  # nothing half written is seen
    assert list(store.sizes("a")) == ["a/big"]


@pytest.mark.parametrize("key", ["../x", "a/../b", ".hidden", "a//b", "a/b/", "/abs"])
def test_keys_are_written_one_way_only(tmp_path: Path, key: str) -> None:
    with pytest.raises(ComputeError, match="invalid shared storage key"):
        DirectoryStore(tmp_path).exists(key)


def test_links_and_fifos_on_shared_storage_are_refused(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_bytes(b"another project's")
    store = DirectoryStore(tmp_path / "shared")
    store.write_bytes("p/real", b"ok")
    root = tmp_path / "shared"
    os.symlink(secret, root / "p" / "link")
    os.symlink(tmp_path, root / "dirlink")
    os.mkfifo(root / "p" / "fifo")
    with pytest.raises(ComputeError, match="cannot be read"):
        store.read_bytes("p/link", max_bytes=100)
    with pytest.raises((ComputeError, FileNotFoundError)):
        store.read_bytes("dirlink/secret", max_bytes=100)
    with pytest.raises(ComputeError, match="not a regular file"):
        store.read_bytes("p/fifo", max_bytes=100)  # refused at once, never waited on
    assert not store.exists("p/link")
    assert list(store.sizes("p")) == ["p/real"]


def test_a_stored_archive_comes_back_checked(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    (tree / "branches").mkdir(parents=True)
    (tree / "branches" / "f").write_bytes(os.urandom(4096))
    local = tmp_path / "archive"
    archive.pack(tree, local)
    store = DirectoryStore(tmp_path / "shared")
    manifest = cold.upload(store, "archive/p-1", local)
    assert cold.verify(store, "archive/p-1") == manifest
    fetched = tmp_path / "fetched"
    cold.download(store, "archive/p-1", fetched)
    archive.unpack(fetched, tmp_path / "back")
    assert (tmp_path / "back" / "branches" / "f").read_bytes() == (
        tree / "branches" / "f"
    ).read_bytes()
    # A byte changed on shared storage: refused before anything is unpacked.
    data = tmp_path / "shared" / "archive" / "p-1" / archive.ARCHIVE_NAME
    damaged = bytearray(data.read_bytes())
    damaged[len(damaged) // 2] ^= 1
    data.write_bytes(bytes(damaged))
    with pytest.raises(ComputeError, match="corrupt"):
        cold.download(store, "archive/p-1", tmp_path / "again")
    assert not (tmp_path / "again").exists()


def _taken_base(dirs: HistoryDirs) -> Base:
    tmp = fresh_tmp(dirs)
    (tmp / "pgdata" / "base").mkdir(parents=True)
    (tmp / "pgdata" / "PG_VERSION").write_bytes(b"18\n")
    (tmp / "pgdata" / "base" / "1").write_bytes(os.urandom(8192))
    return publish_base(
        dirs, tmp, start_lsn=0x1000028, end_lsn=0x1000100, end_time=1, segment_size=16 << 20
    )


def test_a_base_state_ships_only_as_it_was_taken_and_comes_back_checked(tmp_path: Path) -> None:
    store = DirectoryStore(tmp_path / "shared")
    staging = tmp_path / "staging"
    owner = (os.geteuid(), os.getegid())
    # Intact: shipped, and fetched elsewhere checked file by file as it is unpacked (so the
    # rebuild does not read it all again); found already unpacked, it is to be checked again.
    intact = HistoryDirs(tmp_path / "intact")
    base = _taken_base(intact)
    shipping.ship(store, intact, "history/p-1/b-1", staging)
    elsewhere = HistoryDirs(tmp_path / "elsewhere")
    assert fetching.fetch(store, elsewhere, "history/p-1/b-1", staging, owner) is True
    fetched = elsewhere.bases / base.path.name / "pgdata" / "base" / "1"
    assert fetched.read_bytes() == (base.pgdata / "base" / "1").read_bytes()
    assert fetching.fetch(store, elsewhere, "history/p-1/b-1", staging, owner) is False
    # Damaged here after it was taken (its base.json's checksum no longer holds): never shipped.
    damaged = HistoryDirs(tmp_path / "damaged")
    (_taken_base(damaged).pgdata / "base" / "1").write_bytes(os.urandom(8192))
    with pytest.raises(ComputeError, match="pgdata/base/1 no longer matches its checksum"):
        shipping.ship(store, damaged, "history/p-1/b-2", staging)
    assert not [key for key in store.sizes("history/p-1/b-2") if "/base/" in key]


class _ShippedWhileRead(DirectoryStore):
    """A store whose first read of a streamed piece finds its segment shipped whole and the
    piece freed meanwhile, as the platform running beside a ``backups verify`` does."""

    def __init__(self, root: Path, ships: Callable[[], None]) -> None:
        super().__init__(root)
        self._ships: Callable[[], None] | None = ships

    def read_bytes(self, key: str, *, max_bytes: int) -> bytes:
        if "/stream/" in key and self._ships is not None:
            ships, self._ships = self._ships, None
            ships()
        return super().read_bytes(key, max_bytes=max_bytes)


def test_streamed_wal_shipped_whole_while_a_rebuild_reads_it_is_fetched_shipped(
    tmp_path: Path,
) -> None:
    prefix, staging = "history/p-1/b-1", tmp_path / "staging"
    owner = (os.geteuid(), os.getegid())
    here = HistoryDirs(tmp_path / "here")
    _taken_base(here)
    segment = wal.segment_name(1, 1, 16 << 20)  # the base state's first
    whole = os.urandom(1 << 20) + bytes((16 << 20) - (1 << 20))

    def ships() -> None:
        (here.wal / segment).write_bytes(whole)
        shipping.ship(store, here, prefix, staging)

    store = _ShippedWhileRead(tmp_path / "shared", ships)
    here.wal.mkdir(parents=True, exist_ok=True)
    shipping.ship(store, here, prefix, staging)
    # Streamed so far: its first 100 KiB, in two pieces.
    for start, end in ((0, 50 << 10), (50 << 10, 100 << 10)):
        store.write_bytes(streaming.piece_key(prefix, segment, start, end), whole[start:end])
    elsewhere = HistoryDirs(tmp_path / "elsewhere")
    assert fetching.fetch(store, elsewhere, prefix, staging, owner) is True
    assert (elsewhere.wal / segment).read_bytes() == whole
    assert not [key for key in store.sizes(prefix) if "/stream/" in key]  # freed, as it was


class _Refusing(DirectoryStore):
    """A store that refuses the writes of one key, as one over its quota refuses them all."""

    def __init__(self, root: Path, refused: str) -> None:
        super().__init__(root)
        self.refused: str | None = refused

    def write(self, key: str, source: BinaryIO, *, max_bytes: int) -> Written:
        if self.refused is not None and key.endswith(self.refused):
            raise ComputeError(f"s3 put {key}: QuotaExceeded")
        return super().write(key, source, max_bytes=max_bytes)


def test_a_refused_wal_file_fails_the_round_and_no_later_one_is_named(tmp_path: Path) -> None:
    prefix, staging = "history/p-1/b-1", tmp_path / "staging"
    here = HistoryDirs(tmp_path / "here")
    _taken_base(here)
    here.wal.mkdir(parents=True, exist_ok=True)
    names = [wal.segment_name(1, segno, 16 << 20) for segno in (1, 2, 3)]
    for name in names:
        (here.wal / name).write_bytes(os.urandom(4096))
    store = _Refusing(tmp_path / "shared", names[1])
    done = shipping.ship(store, here, prefix, staging)
    assert done.refused is not None and "QuotaExceeded" in str(done.refused)
    assert list(done.head.wal) == names[:1]  # never one past the gap
    store.refused = None
    again = shipping.ship(store, here, prefix, staging, done.head)
    assert again.refused is None
    assert list(again.head.wal) == names


def test_a_backlog_ships_a_share_a_round_in_order(tmp_path: Path) -> None:
    # A round goes through every branch of the node in turn: one with a large backlog ships
    # its share and says so (the next round follows at once), never holding up the others.
    prefix, staging = "history/p-1/b-1", tmp_path / "staging"
    here = HistoryDirs(tmp_path / "here")
    _taken_base(here)
    here.wal.mkdir(parents=True, exist_ok=True)
    share = shipping.WAL_FILES_PER_ROUND
    names = [wal.segment_name(1, segno, 16 << 20) for segno in range(1, share + 3)]
    for name in names:
        (here.wal / name).write_bytes(os.urandom(4096))
    store = DirectoryStore(tmp_path / "shared")
    first = shipping.ship(store, here, prefix, staging)
    assert first.more
    assert list(first.head.wal) == names[:share]  # the oldest, and no gap
    second = shipping.ship(store, here, prefix, staging, first.head)
    assert not second.more
    assert list(second.head.wal) == names
    assert shipping.shipped_wal(store, prefix) == names
