"""The object store as the platform opens it: the bucket's client, the seal, and the fence.

Everything the platform writes goes through :class:`Fenced` over a sealed store: once this
process has lost its lease on the prefix (another platform took it), every write and delete is
refused, so nothing is ever written over another platform's objects.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from pgplane.compute.driver import ComputeError
from pgplane.compute.local.shared.objects import ObjectStore, Unreachable, Written
from pgplane.compute.local.shared.sealed import SealedStore, key_fingerprint, load_archive_key
from pgplane.objectstore.claim import Claim, PrefixLease

if TYPE_CHECKING:
    from pgplane.compute.local.shared.s3 import S3Store


class Guarded:
    """An object store whose writes and deletes are refused while ``refusal`` says why."""

    def __init__(self, inner: ObjectStore) -> None:
        self._inner = inner

    def refusal(self) -> str | None:
        return None

    def _check(self, key: str) -> None:
        if (why := self.refusal()) is not None:
            raise ComputeError(f"{key} not changed in the object store: {why}")

    def _away(self, key: str) -> None:
        """Reads too, while the store has not answered since start: at once, rather than each
        after its timeouts (a start during an outage must not wait on every one)."""
        if (why := self.unanswered()) is not None:
            raise Unreachable(f"{key} not read from the object store: {why}")

    def unanswered(self) -> str | None:
        return None

    @property
    def identity(self) -> str:
        return self._inner.identity

    def write(self, key: str, source: BinaryIO, *, max_bytes: int) -> Written:
        self._check(key)
        return self._inner.write(key, source, max_bytes=max_bytes)

    def write_bytes(self, key: str, data: bytes, *, replace: bool = True) -> Written:
        self._check(key)
        return self._inner.write_bytes(key, data, replace=replace)

    def read(self, key: str, sink: BinaryIO, *, max_bytes: int) -> Written:
        self._away(key)
        return self._inner.read(key, sink, max_bytes=max_bytes)

    def read_bytes(self, key: str, *, max_bytes: int) -> bytes:
        self._away(key)
        return self._inner.read_bytes(key, max_bytes=max_bytes)

    def exists(self, key: str) -> bool:
        self._away(key)
        return self._inner.exists(key)

    def sizes(self, prefix: str) -> dict[str, int]:
        self._away(prefix)
        return self._inner.sizes(prefix)

    def delete(self, prefix: str) -> None:
        self._check(prefix)
        self._inner.delete(prefix)


class Fenced(Guarded):
    """Refuses every change until this process' ``claim`` on the prefix is made, and once its
    ``lease`` on it is lost."""

    def __init__(self, inner: ObjectStore, lease: PrefixLease | None = None) -> None:
        super().__init__(inner)
        self.lease = lease
        self.claim: Claim | None = None

    def refusal(self) -> str | None:
        if self.claim is not None and (why := self.claim.holds_off()) is not None:
            return why
        lost = self.lease is not None and self.lease.lost
        return "another platform holds the prefix now" if lost else None

    def unanswered(self) -> str | None:
        if self.claim is not None and not self.claim.claimed and self.claim.refused is None:
            return "the store has not answered since the start"
        return None


class ReadOnly(Guarded):
    """Refuses every change: a verification only reads."""

    def refusal(self) -> str | None:
        return "a verification changes nothing there"


@dataclass(frozen=True, slots=True)
class Bucket:
    """The prefix's raw objects (the claim's, unsealed), the sealed store for everything else,
    and the archive key's fingerprint."""

    url: str
    raw: S3Store
    sealed: Fenced
    fingerprint: str


def open_bucket(url: str, key_file: Path) -> Bucket:
    """The bucket at ``url``, its credentials from the standard AWS variables and files.
    ValueError for a bad URL or key file; ComputeError for a store that cannot be reached."""
    # boto3 imported here, not with the server: a tenth of a second of every start without one.
    from pgplane.compute.local.shared.s3 import S3Store  # noqa: PLC0415

    key = load_archive_key(key_file)
    raw = S3Store.from_url(url)
    return Bucket(
        url=url, raw=raw, sealed=Fenced(SealedStore(raw, key)), fingerprint=key_fingerprint(key)
    )
