"""Sealed objects over a directory: the format's edges (empty, one frame exactly, many frames),
every way a sealed object can be spoiled, and the archive key file's refusals."""

from __future__ import annotations

import hashlib
import io
import os
from pathlib import Path

import pytest

from pgplane.compute.driver import ComputeError
from pgplane.compute.local.shared.objects import DirectoryStore
from pgplane.compute.local.shared.sealed import (
    FRAME,
    MAGIC,
    SealedStore,
    key_fingerprint,
    load_archive_key,
)

KEY = bytes(range(32))
DAMAGED = r"object a/obj is damaged or was sealed with another archive key"


@pytest.fixture
def inner(tmp_path: Path) -> DirectoryStore:
    return DirectoryStore(tmp_path / "shared")


@pytest.fixture
def sealed(inner: DirectoryStore) -> SealedStore:
    return SealedStore(inner, KEY)


def _raw(inner: DirectoryStore, key: str = "a/obj") -> bytes:
    return inner.read_bytes(key, max_bytes=1 << 30)


@pytest.mark.parametrize(
    "plain",
    [
        b"",
        b"hello",
        os.urandom(FRAME),  # incompressible: a compressed stream just over one frame
        os.urandom(FRAME - 64),  # and one that comes close to a frame exactly
        os.urandom(3 * FRAME + 17),
        bytes(16 << 20),  # a WAL segment of zeros
    ],
    ids=["empty", "small", "frame", "near-frame", "multi-frame", "zeros"],
)
def test_round_trip_returns_the_plaintexts_size_and_sha256(
    sealed: SealedStore, inner: DirectoryStore, plain: bytes
) -> None:
    sent = sealed.write("a/obj", io.BytesIO(plain), max_bytes=len(plain))
    sink = io.BytesIO()
    got = sealed.read("a/obj", sink, max_bytes=len(plain))
    digest = hashlib.sha256(plain).hexdigest()
    assert (sent.size, sent.sha256) == (got.size, got.sha256) == (len(plain), digest)
    assert sink.getvalue() == plain
    raw = _raw(inner)
    assert raw.startswith(MAGIC)
    if plain:
        assert plain[:64] not in raw


def test_zeros_shrink(sealed: SealedStore, inner: DirectoryStore) -> None:
    sealed.write_bytes("a/obj", bytes(16 << 20))
    assert len(_raw(inner)) < 64 << 10


def test_compressed_stream_of_exactly_one_frame(sealed: SealedStore, inner: DirectoryStore) -> None:
    """A compressed stream of exactly FRAME bytes: its one frame is the last, not followed by an
    empty one; sized by searching for the plaintext length that compresses to FRAME."""
    low, high = FRAME - 4096, FRAME
    seed = os.urandom(FRAME)
    found = None
    while low <= high:
        mid = (low + high) // 2
        sealed.write_bytes("a/obj", seed[:mid])
        frames = len(_raw(inner)) - len(MAGIC) - 32
        if frames == FRAME + 16:
            found = mid
            break
        if frames < FRAME + 16:
            low = mid + 1
        else:
            high = mid - 1
    assert found is not None, "no plaintext compressed to exactly one frame"
    assert sealed.read_bytes("a/obj", max_bytes=FRAME) == seed[:found]


def test_write_bytes_keeps_the_first_when_asked(sealed: SealedStore) -> None:
    sealed.write_bytes("a/obj", b"first", replace=False)
    sealed.write_bytes("a/obj", b"second", replace=False)
    assert sealed.read_bytes("a/obj", max_bytes=10) == b"first"
    sealed.write_bytes("a/obj", b"third")
    assert sealed.read_bytes("a/obj", max_bytes=10) == b"third"


def test_listing_and_deleting_pass_through(sealed: SealedStore, inner: DirectoryStore) -> None:
    sealed.write_bytes("a/obj", b"x")
    sealed.write_bytes("a/b/c", b"y")
    assert list(sealed.sizes("a")) == list(inner.sizes("a")) == ["a/b/c", "a/obj"]
    assert sealed.exists("a/obj")
    sealed.delete("a")
    assert not sealed.exists("a/obj")
    assert sealed.identity == inner.identity


def test_max_bytes_bounds_the_plaintext_both_ways(
    sealed: SealedStore, inner: DirectoryStore
) -> None:
    with pytest.raises(ComputeError, match="more than 100 bytes to store"):
        sealed.write("a/obj", io.BytesIO(bytes(101)), max_bytes=100)
    assert not inner.exists("a/obj")
    # Zeros: the sealed object is tiny, the plaintext is not.
    sealed.write("a/obj", io.BytesIO(bytes(8 << 20)), max_bytes=8 << 20)
    with pytest.raises(ComputeError, match=r"a/obj is larger than 1048576 bytes"):
        sealed.read("a/obj", io.BytesIO(), max_bytes=1 << 20)
    with pytest.raises(FileNotFoundError):
        sealed.read_bytes("a/none", max_bytes=10)


def _spoil(inner: DirectoryStore, raw: bytes, key: str = "a/obj") -> None:
    inner.write_bytes(key, raw)


@pytest.fixture
def three_frames(sealed: SealedStore, inner: DirectoryStore) -> bytes:
    sealed.write_bytes("a/obj", os.urandom(2 * FRAME + 1000))
    return _raw(inner)


def test_a_flipped_byte_anywhere_is_refused(
    sealed: SealedStore, inner: DirectoryStore, three_frames: bytes
) -> None:
    for at in (0, 10, 40, 41 + FRAME, len(three_frames) - 1):
        raw = bytearray(three_frames)
        raw[at] ^= 0x01
        _spoil(inner, bytes(raw))
        with pytest.raises(ComputeError, match=DAMAGED):
            sealed.read_bytes("a/obj", max_bytes=4 * FRAME)


@pytest.mark.parametrize(
    "cut",
    [0, 20, 40, 41, 40 + FRAME + 16, 40 + 2 * (FRAME + 16), -1],
    ids=["nothing", "in-header", "header-only", "in-frame", "at-frame", "at-last", "last-byte"],
)
def test_a_truncated_object_is_refused(
    sealed: SealedStore, inner: DirectoryStore, three_frames: bytes, cut: int
) -> None:
    _spoil(inner, three_frames[:cut])
    with pytest.raises(ComputeError, match=DAMAGED):
        sealed.read_bytes("a/obj", max_bytes=4 * FRAME)


def test_data_after_the_last_frame_is_refused(
    sealed: SealedStore, inner: DirectoryStore, three_frames: bytes
) -> None:
    for tail in (b"x", bytes(FRAME + 16), three_frames[40:]):
        _spoil(inner, three_frames + tail)
        with pytest.raises(ComputeError, match=DAMAGED):
            sealed.read_bytes("a/obj", max_bytes=8 * FRAME)


def test_frames_reordered_are_refused(
    sealed: SealedStore, inner: DirectoryStore, three_frames: bytes
) -> None:
    head, size = three_frames[:40], FRAME + 16
    first, second = three_frames[40 : 40 + size], three_frames[40 + size : 40 + 2 * size]
    _spoil(inner, head + second + first + three_frames[40 + 2 * size :])
    with pytest.raises(ComputeError, match=DAMAGED):
        sealed.read_bytes("a/obj", max_bytes=4 * FRAME)


def test_an_object_under_another_key_or_archive_key_is_refused(
    sealed: SealedStore, inner: DirectoryStore
) -> None:
    sealed.write_bytes("a/other", b"tenant data")
    _spoil(inner, _raw(inner, "a/other"))  # copied to a/obj
    with pytest.raises(ComputeError, match=DAMAGED):
        sealed.read_bytes("a/obj", max_bytes=100)
    other_key = SealedStore(inner, bytes(32))
    with pytest.raises(ComputeError, match="object a/other is damaged"):
        other_key.read_bytes("a/other", max_bytes=100)


def test_an_unsealed_object_is_refused(sealed: SealedStore, inner: DirectoryStore) -> None:
    _spoil(inner, b"plain text, never sealed, long enough to hold a header and a tag")
    with pytest.raises(ComputeError, match=DAMAGED):
        sealed.read_bytes("a/obj", max_bytes=100)


def test_a_short_archive_key_is_refused(inner: DirectoryStore) -> None:
    with pytest.raises(ValueError, match="at least 32 bytes"):
        SealedStore(inner, bytes(31))


# -- the archive key file ---------------------------------------------------------------------


def test_load_archive_key_reads_a_private_file(tmp_path: Path) -> None:
    path = tmp_path / "archive.key"
    path.write_bytes(KEY + b"\n")
    path.chmod(0o600)
    assert load_archive_key(path) == KEY + b"\n"
    path.chmod(0o400)
    assert load_archive_key(path) == KEY + b"\n"


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o620, 0o644])
def test_load_archive_key_refuses_a_file_others_reach(tmp_path: Path, mode: int) -> None:
    path = tmp_path / "archive.key"
    path.write_bytes(KEY)
    path.chmod(mode)
    with pytest.raises(ValueError, match=rf"{path} is readable or writable by others"):
        load_archive_key(path)


def test_load_archive_key_refuses_missing_short_and_odd_files(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=rf"{tmp_path / 'none'} does not exist"):
        load_archive_key(tmp_path / "none")
    short = tmp_path / "short.key"
    short.write_bytes(bytes(31))
    short.chmod(0o600)
    with pytest.raises(ValueError, match=rf"{short} holds 31 bytes"):
        load_archive_key(short)
    link = tmp_path / "link.key"
    link.symlink_to(short)  # followed (a mounted secret is a link), its target judged
    with pytest.raises(ValueError, match=rf"{link} holds 31 bytes"):
        load_archive_key(link)
    with pytest.raises(ValueError, match="not a regular file"):
        load_archive_key(tmp_path)


def test_fingerprints_name_a_key_without_showing_it() -> None:
    assert key_fingerprint(KEY) == key_fingerprint(bytes(KEY))
    assert key_fingerprint(KEY) != key_fingerprint(bytes(32))
    assert len(key_fingerprint(KEY)) == 32
    assert KEY.hex()[:32] != key_fingerprint(KEY)
