"""A platform's hold on its prefix: who the prefix belongs to, and a lease on it.

Two platforms writing under one prefix would overwrite each other's history, and a recovered
platform started beside the one it was recovered from would fork it. So, under the prefix:

``platform.json``
    made once, by the first ``serve`` (with ``If-None-Match: *``: of two first starts, one
    wins): the platform's id (kept in its store, so every node of a PostgreSQL store, and a
    platform recovered from a copy of its SQLite store, is the same platform) and the
    fingerprint of the archive key that seals its objects. A ``serve`` of another id is
    refused, naming ``pgplane recover``; a key of another fingerprint is refused before
    anything is read or written.
``lease.json``
    with a SQLite store (one node), the live holder: its process, its host and until when it
    holds the prefix (a PostgreSQL store's nodes hold their leases in the store). It lasts as
    long as a node's lease (``PGPLANE_NODE_LEASE_SECONDS``: how long a lost platform holds its
    prefix before a recovery may take it) and is renewed at each of the node's beats
    (``PGPLANE_NODE_HEARTBEAT_SECONDS``) with ``If-Match`` on what was read, so a renewal never
    writes over a lease someone else took meanwhile: the holder that finds its lease taken
    stops writing.
    A start takes a lapsed lease, or one its own data directory left on this host (the
    directory's server lock says that process is gone); any other live one is refused.

These two objects hold no tenant data and are not sealed: an operator can read them with any S3
client to see who holds a prefix.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import socket
import time
from typing import Protocol

import msgspec

from pgplane.compute.driver import ComputeError
from pgplane.compute.local.shared.objects import off_loop
from pgplane.core import clock
from pgplane.store import Tx

log = logging.getLogger(__name__)

PLATFORM = "platform.json"
LEASE = "lease.json"
_FORMAT = 1
_MAX_OBJECT = 64 << 10
# The node's defaults (config.py): a lease of 20 s, renewed every 5.
RENEW_SECONDS = 5.0
LEASE_SECONDS = 20.0
CLAIM_RETRY_SECONDS = 2.0


class Conditional(Protocol):
    """What the lease needs of a store beyond objects: writes that are refused when the object
    is not what the writer last read (S3's conditional writes)."""

    def put_if_absent(self, key: str, data: bytes) -> bool: ...

    def put_if_match(self, key: str, data: bytes, etag: str) -> bool: ...

    def get_with_etag(self, key: str, *, max_bytes: int) -> tuple[bytes, str]: ...


class Refused(Exception):
    """The prefix is not this platform's to write (the message says whose it is and why)."""


class Platform(msgspec.Struct, frozen=True, kw_only=True):
    format: int
    platform: str
    key: str
    created_at: float


class Lease(msgspec.Struct, frozen=True, kw_only=True):
    format: int
    platform: str
    holder: str
    host: str
    expires_at: float


async def platform_id(tx: Tx) -> str:
    """The platform's id, as its store holds it (made on first use)."""
    found = await tx.get_platform_id()
    if found is None:
        found = f"pgplane-{secrets.token_hex(8)}"
        await tx.put_platform_id(platform_id=found, now=clock.now_us())
    return found


def read_platform(store: Conditional) -> Platform | None:
    """The prefix's owner, or None on an empty prefix."""
    try:
        data, _ = store.get_with_etag(PLATFORM, max_bytes=_MAX_OBJECT)
    except FileNotFoundError:
        return None
    try:
        return msgspec.json.decode(data, type=Platform)
    except msgspec.DecodeError as exc:
        raise ComputeError(
            f"{PLATFORM} under the object store's prefix is unreadable: {exc}"
        ) from None


def check_key(found: Platform, fingerprint: str) -> None:
    if found.key != fingerprint:
        raise Refused(
            "the archive key is not the one this prefix's objects were sealed with (key"
            f" fingerprint {fingerprint}, the prefix's {found.key}): give the platform's own"
            " --archive-key-file"
        )


def own(store: Conditional, *, platform: str, fingerprint: str) -> Platform:
    """The prefix made this platform's, or found to be: Refused when it is another's, or
    sealed with another key."""
    found = read_platform(store)
    if found is None:
        made = Platform(format=_FORMAT, platform=platform, key=fingerprint, created_at=time.time())
        if store.put_if_absent(PLATFORM, msgspec.json.encode(made)):
            log.info("object store prefix made platform %s's", platform)
            return made
        found = read_platform(store)  # another start won the race
        assert found is not None  # noqa: S101 - it exists: the put was refused for it
    check_key(found, fingerprint)
    if found.platform != platform:
        raise Refused(
            f"the object store's prefix holds platform {found.platform}, not this data"
            " directory's: bring that platform back here with `pgplane recover` (into an empty"
            " data directory), or give this one a prefix of its own"
        )
    return found


class PrefixLease:
    """This process' lease on the prefix (see the module's docstring)."""

    def __init__(
        self,
        store: Conditional,
        *,
        platform: str,
        instance: str,
        seconds: float = LEASE_SECONDS,
        renew_seconds: float = RENEW_SECONDS,
    ) -> None:
        self._store = store
        self.platform = platform
        self.instance = instance
        self.seconds = seconds
        self._renew_seconds = renew_seconds
        self.host = socket.gethostname()
        self._etag: str | None = None
        self.lost = False

    def _lease(self, expires_at: float) -> bytes:
        return msgspec.json.encode(
            Lease(
                format=_FORMAT,
                platform=self.platform,
                holder=self.instance,
                host=self.host,
                expires_at=expires_at,
            )
        )

    def _current(self) -> tuple[Lease | None, str | None]:
        try:
            data, etag = self._store.get_with_etag(LEASE, max_bytes=_MAX_OBJECT)
        except FileNotFoundError:
            return None, None
        try:
            return msgspec.json.decode(data, type=Lease), etag
        except msgspec.DecodeError:
            return None, etag  # unreadable: taken over like a lapsed one

    def take(self) -> None:
        """Hold the prefix, or Refused naming the live holder. A live lease of this holder on
        this host is its own dead process' (a holder is a data directory's: its server lock
        says no other process runs on it)."""
        current, etag = self._current()
        now = time.time()
        if current is not None and current.expires_at > now:
            ours = current.holder == self.instance and current.host == self.host
            if current.platform != self.platform or not ours:
                raise Refused(
                    f"a live platform holds the object store's prefix (host {current.host},"
                    f" lease for {current.expires_at - now:.0f} s more); stop it first"
                )
        data = self._lease(now + self.seconds)
        taken = (
            self._store.put_if_absent(LEASE, data)
            if etag is None
            else self._store.put_if_match(LEASE, data, etag)
        )
        if not taken:
            raise Refused("another platform took the object store's prefix just now")
        _, self._etag = self._current()

    def renew(self) -> bool:
        """False once the lease is someone else's: nothing may be written any more."""
        if self.lost or self._etag is None:
            return False
        if self._store.put_if_match(LEASE, self._lease(time.time() + self.seconds), self._etag):
            _, self._etag = self._current()
            return True
        self.lost = True
        log.error("the object store's prefix was taken by another platform: shipping stops")
        return False

    def release(self) -> None:
        """A graceful stop: the lease ends now, so a recovery elsewhere need not wait for it."""
        if self._etag is not None and not self.lost:
            self._store.put_if_match(LEASE, self._lease(time.time()), self._etag)
            self._etag = None

    def remaining(self) -> float:
        """Seconds the current lease of another holder still runs (0: none, or lapsed)."""
        current, _ = self._current()
        if current is None or current.holder == self.instance:
            return 0.0
        return max(0.0, current.expires_at - time.time())

    async def run(self) -> None:
        """Renew until cancelled, or until the lease is lost."""
        while not self.lost:
            await asyncio.sleep(self._renew_seconds)
            try:
                await off_loop(self.renew)
            except ComputeError as exc:  # the store unreachable: the next beat tries again
                log.warning("object store lease not renewed: %s", exc)


class Claimable(Conditional, Protocol):
    def check_writable(self) -> None: ...


class Claim:
    """This process' claim on the prefix: the store found writable, the prefix found (or made)
    this platform's and, with a SQLite store (``instance`` given), its lease taken.

    Made at start. When the store does not answer then, on a data directory that served
    before, ``serve`` starts all the same (a restart during an outage must not keep the
    computes' clients out), and :meth:`run` makes the claim once the store answers; until
    then nothing is written there (``bucket.Fenced`` asks :meth:`holds_off`)."""

    def __init__(
        self,
        store: Claimable,
        *,
        platform: str,
        fingerprint: str,
        instance: str | None,
        lease_seconds: float = LEASE_SECONDS,
        renew_seconds: float = RENEW_SECONDS,
    ) -> None:
        self._store = store
        self.platform = platform
        self._fingerprint = fingerprint
        self.lease = (
            None
            if instance is None
            else PrefixLease(
                store,
                platform=platform,
                instance=instance,
                seconds=lease_seconds,
                renew_seconds=renew_seconds,
            )
        )
        self.claimed = False
        self.refused: str | None = None
        self._inflight: asyncio.Future[None] | None = None

    def holds_off(self) -> str | None:
        """Why nothing may be written under the prefix now; None when it may."""
        if self.refused is not None:
            return f"the prefix is not this platform's: {self.refused}"
        if not self.claimed:
            return "the prefix is not claimed yet (the store did not answer at start)"
        return None

    def _claim(self) -> None:
        self._store.check_writable()
        own(self._store, platform=self.platform, fingerprint=self._fingerprint)
        if self.lease is not None:
            self.lease.take()
        self.claimed = True

    async def attempt(self) -> None:
        """One try (blocking calls off the loop); a try still running from before (its
        caller stopped waiting) is waited for rather than doubled."""
        if self._inflight is None or self._inflight.done():
            self._inflight = asyncio.ensure_future(off_loop(self._claim))
        await asyncio.shield(self._inflight)

    async def run(self) -> None:
        """Claim the prefix once the store answers, if start could not; then hold the lease."""
        waited = not self.claimed
        while not self.claimed:
            await asyncio.sleep(CLAIM_RETRY_SECONDS)
            try:
                await self.attempt()
            except Refused as exc:
                self.refused = str(exc)
            except ComputeError as exc:
                log.warning("object store prefix not claimed yet: %s", exc)
            if self.refused is not None:
                log.error(
                    "object store prefix not claimed: %s; nothing is written there", self.refused
                )
                return
        if waited:
            log.info("object store prefix claimed: shipping resumes")
        if self.lease is not None:
            await self.lease.run()
