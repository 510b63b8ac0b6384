"""Objects sealed before they leave the machine: compressed, encrypted and authenticated.

A bucket is someone else's disk. :class:`SealedStore` wraps any :class:`ObjectStore` so that what
reaches it is ciphertext under an archive key the platform keeps (``load_archive_key``), and what
comes back is checked: a flipped byte, a truncated object, an object copied or renamed to another
key, or one sealed under another archive key is refused by name, never handed on as data.

The format of a sealed object, version 1::

    magic   8 bytes   b"PGPLANE\\x01"
    salt   32 bytes   random, new for every write
    frame_0 .. frame_n

The object's key is ``HKDF-SHA256(ikm=archive key, salt=salt, info=b"pgplane object v1\\x00" +
the object's key in UTF-8, length=32)``: naming the key binds the object to it, so one copied to
another key does not open. The plaintext is compressed as one zstandard stream (WAL segments
that Postgres switched early are mostly zeros), and that stream is cut into pieces of exactly
``FRAME`` (1 MiB) bytes, the last one 0 to ``FRAME`` bytes; there is always a last piece, even
an empty one. Piece ``i`` is sealed with AES-256-GCM::

    frame_i = ciphertext_i || tag_i (16 bytes)
    nonce_i = 8 zero bytes || i as 4 bytes big-endian
    aad_i   = i as 4 bytes big-endian || 1 byte: 1 for the last frame, else 0

So every frame but the last is ``FRAME + 16`` bytes and a reader knows the last by the end of
the object: truncation at a frame boundary fails (that frame was sealed as not the last), and so
does anything appended after the last frame (the last was sealed as the last). A nonce repeats
only under one salt, that is one object's own key. At most 2**32 frames (4 PiB compressed).

What a read passes to its sink is only ever authenticated plaintext, but it arrives frame by
frame, before the end of the object is checked: a caller that gets an error must drop what the
sink received (as every caller of a store does with a read that raised).

The control objects (the storage's identity, a lease, the probe of ``check_writable``) hold no
tenant data and are compared across nodes by their raw bytes and ETags: they are not sealed.
``identity`` passes through to the inner store; the conditional operations are the inner store's
own, reached as ``sealed.inner``.
"""

from __future__ import annotations

import hashlib
import hmac
import io
import os
import stat
from pathlib import Path
from typing import BinaryIO, cast

import zstandard
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from pgplane.compute.driver import ComputeError
from pgplane.compute.local.shared.objects import ObjectStore, Written

MAGIC = b"PGPLANE\x01"
FRAME = 1 << 20
_SALT = 32
_TAG = 16
_HEADER = len(MAGIC) + _SALT
_SEALED_FRAME = FRAME + _TAG
_MAX_FRAMES = 1 << 32
_LEVEL = 3  # zstandard's default: hundreds of MB/s, and zeros shrink to nearly nothing at any level
_MIN_KEY = 32
_INFLATE_SLICE = 4 << 10


class SealedStore:
    """``inner`` with every object sealed under ``archive_key`` (see the module's docstring)."""

    def __init__(self, inner: ObjectStore, archive_key: bytes) -> None:
        if len(archive_key) < _MIN_KEY:
            raise ValueError(f"an archive key has at least {_MIN_KEY} bytes")
        self.inner = inner
        self._archive_key = archive_key

    @property
    def identity(self) -> str:
        return self.inner.identity

    def write(self, key: str, source: BinaryIO, *, max_bytes: int) -> Written:
        sealing = _Sealing(source, self._object_key(key, os.urandom(_SALT)), key, max_bytes)
        self.inner.write(key, cast(BinaryIO, sealing), max_bytes=sealed_bound(max_bytes))
        return sealing.written()

    def write_bytes(self, key: str, data: bytes, *, replace: bool = True) -> Written:
        sealing = _Sealing(
            io.BytesIO(data), self._object_key(key, os.urandom(_SALT)), key, len(data)
        )
        self.inner.write_bytes(key, sealing.read(), replace=replace)
        return sealing.written()

    def read(self, key: str, sink: BinaryIO, *, max_bytes: int) -> Written:
        opening = _Opening(self, key, sink, max_bytes)
        # Neither is a whole file object: each has what a store calls (read, or write).
        self.inner.read(key, cast(BinaryIO, opening), max_bytes=sealed_bound(max_bytes))
        return opening.finish()

    def read_bytes(self, key: str, *, max_bytes: int) -> bytes:
        sink = io.BytesIO()
        self.read(key, sink, max_bytes=max_bytes)
        return sink.getvalue()

    def exists(self, key: str) -> bool:
        return self.inner.exists(key)

    def sizes(self, prefix: str) -> dict[str, int]:
        return self.inner.sizes(prefix)

    def delete(self, prefix: str) -> None:
        self.inner.delete(prefix)

    def _object_key(self, key: str, salt: bytes) -> _Keyed:
        info = b"pgplane object v1\x00" + key.encode()
        hkdf = HKDF(algorithm=hashes.SHA256(), length=32, salt=salt, info=info)
        return _Keyed(salt, AESGCM(hkdf.derive(self._archive_key)))


def sealed_bound(max_bytes: int) -> int:
    """The most a sealed object of at most ``max_bytes`` of plaintext can take: zstandard's own
    worst case (a little over the input) in frames of ``FRAME``, each with its tag."""
    compressed = max_bytes + (max_bytes >> 7) + (1 << 10)
    return _HEADER + compressed + (compressed // FRAME + 1) * _TAG


class _Keyed:
    __slots__ = ("aead", "salt")

    def __init__(self, salt: bytes, aead: AESGCM) -> None:
        self.salt, self.aead = salt, aead


def _nonce_aad(index: int, last: bool) -> tuple[bytes, bytes]:
    if index >= _MAX_FRAMES:
        raise ComputeError("a sealed object is limited to 2**32 frames")
    counter = index.to_bytes(4, "big")
    return bytes(8) + counter, counter + (b"\x01" if last else b"\x00")


class _Sealing:
    """A readable stream of the sealed object, made as it is read: ``source`` is pulled a chunk
    at a time, so an object of any size is held a frame or two at a time."""

    def __init__(self, source: BinaryIO, keyed: _Keyed, key: str, max_bytes: int) -> None:
        self._source, self._keyed, self._key, self._max = source, keyed, key, max_bytes
        self._compressor = zstandard.ZstdCompressor(level=_LEVEL).compressobj()
        self._compressed = bytearray()  # not yet sealed
        self._out = bytearray(MAGIC + keyed.salt)  # sealed, not yet read
        self._index = 0
        self._done = False
        self._digest, self._size = hashlib.sha256(), 0

    def read(self, n: int = -1) -> bytes:
        want = n if n >= 0 else None
        while not self._done and (want is None or len(self._out) < want):
            self._pull()
        if want is None or want >= len(self._out):
            chunk = bytes(self._out)
            self._out.clear()
        else:
            chunk = bytes(self._out[:want])
            del self._out[:want]
        return chunk

    def _pull(self) -> None:
        plain = self._source.read(FRAME)
        if plain:
            self._size += len(plain)
            if self._size > self._max:
                raise ComputeError(f"{self._key}: more than {self._max} bytes to store")
            self._digest.update(plain)
            self._compressed += self._compressor.compress(plain)
            # Only whole frames while more may come: the last one is sealed as the last.
            while len(self._compressed) > FRAME:
                self._seal(FRAME, last=False)
            return
        self._compressed += self._compressor.flush()
        while len(self._compressed) > FRAME:
            self._seal(FRAME, last=False)
        self._seal(len(self._compressed), last=True)
        self._done = True

    def _seal(self, n: int, *, last: bool) -> None:
        nonce, aad = _nonce_aad(self._index, last)
        self._out += self._keyed.aead.encrypt(nonce, bytes(self._compressed[:n]), aad)
        del self._compressed[:n]
        self._index += 1

    def written(self) -> Written:
        return Written(self._size, self._digest.hexdigest())


class _Opening:
    """A sink for the sealed bytes that passes the plaintext on to ``sink`` frame by frame.

    A full frame is opened only once a byte after it has come (else it may be the last);
    :meth:`finish` opens what is left as the last.
    """

    def __init__(self, store: SealedStore, key: str, sink: BinaryIO, max_bytes: int) -> None:
        self._store, self._key = store, key
        self._keyed: _Keyed | None = None
        self._pending = bytearray()
        self._index = 0
        self._plain = _Bounded(sink, key, max_bytes)
        self._inflate = zstandard.ZstdDecompressor().decompressobj()

    def write(self, data: bytes) -> int:
        self._pending += data
        if self._keyed is None:
            if len(self._pending) < _HEADER:
                return len(data)
            self._keyed = self._header()
        while len(self._pending) > _SEALED_FRAME:
            self._open(_SEALED_FRAME, last=False)
        return len(data)

    def finish(self) -> Written:
        if self._keyed is None:
            if len(self._pending) < _HEADER:
                raise self._damaged()
            self._keyed = self._header()
        if len(self._pending) < _TAG:
            raise self._damaged()  # the last frame is missing
        self._open(len(self._pending), last=True)
        # A stream cut short, or more after its end: no writer of this format makes either
        # (the frames themselves were whole), so the object is not what was sealed.
        if not self._inflate.eof or self._inflate.unused_data:
            raise self._damaged()
        return self._plain.written()

    def _header(self) -> _Keyed:
        if self._pending[: len(MAGIC)] != MAGIC:
            raise self._damaged()
        salt = bytes(self._pending[len(MAGIC) : _HEADER])
        del self._pending[:_HEADER]
        return self._store._object_key(self._key, salt)

    def _open(self, n: int, *, last: bool) -> None:
        if self._keyed is None:
            raise self._damaged()
        nonce, aad = _nonce_aad(self._index, last)
        try:
            piece = self._keyed.aead.decrypt(nonce, bytes(self._pending[:n]), aad)
        except InvalidTag:
            raise self._damaged() from None
        del self._pending[:n]
        self._index += 1
        # Fed a slice at a time so that what one call inflates stays bounded (zstandard inflates
        # at most about 32,000-fold): a piece of zeros is never held whole, and max_bytes is
        # checked as the plaintext grows.
        view = memoryview(piece)
        for start in range(0, len(view), _INFLATE_SLICE):
            if self._inflate.eof:
                raise self._damaged()
            try:
                self._plain.write(self._inflate.decompress(view[start : start + _INFLATE_SLICE]))
            except zstandard.ZstdError:
                raise self._damaged() from None

    def _damaged(self) -> ComputeError:
        return ComputeError(f"object {self._key} is damaged or was sealed with another archive key")


class _Bounded:
    """The caller's sink, hashed, counted and bounded by ``max_bytes`` of plaintext."""

    def __init__(self, sink: BinaryIO, key: str, max_bytes: int) -> None:
        self._sink, self._key, self._max = sink, key, max_bytes
        self._digest, self._size = hashlib.sha256(), 0

    def write(self, data: bytes) -> int:
        self._size += len(data)
        if self._size > self._max:
            raise ComputeError(f"shared object {self._key} is larger than {self._max} bytes")
        self._digest.update(data)
        self._sink.write(data)
        return len(data)

    def written(self) -> Written:
        return Written(self._size, self._digest.hexdigest())


def load_archive_key(path: Path) -> bytes:
    """The archive key kept in ``path``: its bytes, at least 32 of them, in a file no one but its
    owner may read (as ssh refuses a private key that others can read)."""
    # A link is followed (a secret mounted by Kubernetes is one); its target's mode is checked.
    # O_NONBLOCK: a FIFO put there is refused below, not waited on.
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        raise ValueError(f"archive key file {path} does not exist") from None
    except OSError as exc:
        raise ValueError(f"archive key file {path} cannot be opened: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"archive key file {path} is not a regular file")
        if st.st_mode & 0o077:
            raise ValueError(
                f"archive key file {path} is readable or writable by others "
                f"(mode {stat.S_IMODE(st.st_mode):04o}): chmod 600 it"
            )
        key = os.read(fd, 1 << 16)
    finally:
        os.close(fd)
    if len(key) < _MIN_KEY:
        raise ValueError(
            f"archive key file {path} holds {len(key)} bytes; an archive key has at least "
            f"{_MIN_KEY} (e.g. head -c 32 /dev/urandom > {path})"
        )
    return key


def key_fingerprint(key: bytes) -> str:
    """A name for an archive key that reveals nothing of it: a platform records it with what it
    sealed, and refuses a different key by this name before reading anything."""
    return hmac.new(key, b"pgplane archive key check v1", hashlib.sha256).hexdigest()[:32]
