"""Each branch's history shipped to shared storage (fetched back on another node by
:mod:`.fetching`).

A branch's history stays beside its data (``history/archiving.py``: WAL archived by hard link,
at no I/O cost to the compute), and the platform, as root, copies it to shared storage, where no
compute reaches::

    history/<project_id>/<branch_id>/wal/<segment>          a completed WAL segment, or a
                                                              timeline's history file
    history/<project_id>/<branch_id>/base/<end lsn>/...      a base state, as a cold archive
                                                              (data.tar.zst and manifest.json)
    history/<project_id>/<branch_id>/head.json               what the above holds that forms
                                                              the history: written last

``head.json`` names the base states and, with its sha256, each WAL file: a node that rebuilds
the branch trusts nothing else it finds (objects a crash left unlisted are removed by the next
round). Each round mirrors the branch's history as it is here: new files are copied, those the
keeper freed here are freed there, so shared storage holds the branch's window and no more.

The WAL a round copies is the tenant's (its postmasters write the archive): it is read only
through the safe reader (no link followed, no FIFO opened for long, bounded), and what is
shipped is what was read, with its checksum. A base state is root's own copy.

A node rebuilds the branch from its newest base state and every segment after it (``fetching``,
then a replay to the end, ``history.py``): every transaction whose commit was in a
shipped segment is there. What the dead node had not shipped is lost: the segment its compute
was writing (Postgres completes one at ``archive_timeout``, set on computes when there is
shared storage) and what was archived since the last round (``ship_seconds``).
"""

from __future__ import annotations

import logging
import os
import re
import secrets
import shutil
from pathlib import Path
from typing import Annotated, NamedTuple

import msgspec

from pgplane import failpoints
from pgplane.compute.driver import ComputeError
from pgplane.compute.local.cold import archive
from pgplane.compute.local.cold.manifest import ARCHIVE_NAMES, MANIFEST_NAME
from pgplane.compute.local.history.archiving import Base, HistoryDirs, list_bases
from pgplane.compute.local.shared import cold, holes, streaming
from pgplane.compute.local.shared.objects import ObjectStore
from pgplane.compute.local.tenants import untrusted

log = logging.getLogger(__name__)

HEAD = "head.json"
_FORMAT = 1
SEGMENT = re.compile(r"[0-9A-F]{24}")
HISTORY = re.compile(r"[0-9A-F]{8}\.history")
_BASE = re.compile(r"[0-9A-F]{16}")
# Postgres' segments are 1 MiB to 1 GiB (16 MiB by default); a timeline history is lines of
# text, one per switch.
MAX_SEGMENT = 1 << 30
MAX_HISTORY_FILE = 1 << 20
_MAX_HEAD = 64 << 20
_CHUNK = 1 << 20
# What one round ships of one branch at most: the round goes through every branch of the node
# in turn, so a project with a large backlog (a bulk load, a store that was away) ships it over
# several rounds, in step with the others, rather than holding up everyone's for its own.
BASES_PER_ROUND = 1
WAL_FILES_PER_ROUND = 8
# The tenants' archived files already said to be refused (bounded: forgotten all at once).
_said: set[tuple[str, str]] = set()
_MAX_SAID = 10_000

Sha256 = Annotated[str, msgspec.Meta(pattern="^[0-9a-f]{64}$")]
WalName = Annotated[str, msgspec.Meta(pattern="^([0-9A-F]{24}|[0-9A-F]{8}\\.history)$")]
BaseName = Annotated[str, msgspec.Meta(pattern="^[0-9A-F]{16}$")]


class Head(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A branch's history on shared storage: its base states (by end LSN) and WAL files."""

    format: int
    bases: tuple[BaseName, ...]
    wal: dict[WalName, Sha256]
    # When the newest WAL shipped was last written here (epoch us): a rebuild holds every
    # commit up to it (a recovery prints it as the branch's recovered-to time).
    wal_end_at: int = 0


class Shipped(NamedTuple):
    """One round's outcome for a branch: files copied, the head as it is there now, the bytes
    its objects take there (None when this round did not list them: nothing changed), and the
    store's refusal of a WAL file, if any (the round shipped none after it)."""

    copied: int
    head: Head
    stored: int | None
    refused: ComputeError | None = None  # a WAL file's upload (what came before it went on)
    more: bool = False  # the round's share spent with files left: the next round goes on


def prefix_of(project_id: str, branch_id: str) -> str:
    return f"history/{project_id}/{branch_id}"


def read_head(store: ObjectStore, prefix: str) -> Head | None:
    try:
        data = store.read_bytes(f"{prefix}/{HEAD}", max_bytes=_MAX_HEAD)
    except FileNotFoundError:
        return None
    try:
        head = msgspec.json.decode(data, type=Head)
    except msgspec.DecodeError as exc:
        raise ComputeError(f"{prefix}/{HEAD} on shared storage is unreadable: {exc}") from None
    if head.format != _FORMAT:
        raise ComputeError(f"{prefix}/{HEAD}: format {head.format}, this version reads {_FORMAT}")
    return head


def shipped_wal(store: ObjectStore, prefix: str) -> list[str]:
    """The WAL segments the branch's head names there (blocking)."""
    head = read_head(store, prefix)
    return [] if head is None else [n for n in head.wal if SEGMENT.fullmatch(n)]


def has_base(store: ObjectStore, prefix: str) -> bool:
    """Whether the branch's head there names a base state (blocking; False when the store
    cannot say: asked again later)."""
    try:
        head = read_head(store, prefix)
    except (ComputeError, OSError) as exc:
        log.info("the history of %s on shared storage cannot be read: %s", prefix, exc)
        return False
    return head is not None and bool(head.bases)


# -- shipping -----------------------------------------------------------------------------------


def ship(
    store: ObjectStore, dirs: HistoryDirs, prefix: str, staging: Path, known: Head | None = None
) -> Shipped:
    """One round for one branch (blocking): what its history holds here, there too. ``known``:
    the head this node
    wrote last round, so that a round with nothing new asks the storage nothing (an object
    store bills each request, and rounds run every second)."""
    head = known or read_head(store, prefix) or Head(format=_FORMAT, bases=(), wal={})
    copied = 0
    bases: list[str] = []
    base_budget, wal_budget = BASES_PER_ROUND, WAL_FILES_PER_ROUND
    more = False
    for base in list_bases(dirs):
        name = base.path.name
        if _BASE.fullmatch(name) is None:
            continue
        if name not in head.bases:
            if base_budget == 0:  # named once shipped, in a later round
                more = True
                continue
            base_budget -= 1
            _ship_base(store, base, f"{prefix}/base/{name}", staging)
            failpoints.reached_in_thread("ship:base_stored")
            copied += 1
        bases.append(name)
    wal: dict[str, str] = {}
    end_at = head.wal_end_at
    refused: ComputeError | None = None
    for name in local_wal(dirs.wal):
        if name in head.wal:
            wal[name] = head.wal[name]
            continue
        if refused is not None:  # none shipped past one the store refused (no gap named)
            continue
        if wal_budget == 0:  # nor past the round's share: the next round goes on from here
            more = True
            continue
        wal_budget -= 1
        written_at = _written_at(dirs, name)
        try:
            sha = _ship_wal(store, dirs, name, f"{prefix}/wal/{name}")
        except ComputeError as exc:  # the next round tries it again, and those after it
            refused = exc
            continue
        if sha is not None:
            failpoints.reached_in_thread("ship:wal_stored")
            wal[name] = sha
            copied += 1
            end_at = max(end_at, written_at)
    new = Head(format=_FORMAT, bases=tuple(bases), wal=dict(sorted(wal.items())), wal_end_at=end_at)
    if new != head:
        store.write_bytes(f"{prefix}/{HEAD}", msgspec.json.encode(new))
    stored = None
    if new != head or known is None:
        stored = _free(store, prefix, new)
    return Shipped(copied, new, stored, refused, more)


def local_wal(wal: Path) -> list[str]:
    """The WAL files archived in ``wal`` (segments and timeline histories), sorted."""
    try:
        names = os.listdir(wal)
    except FileNotFoundError:
        return []
    return sorted(n for n in names if SEGMENT.fullmatch(n) or HISTORY.fullmatch(n))


def _written_at(dirs: HistoryDirs, name: str) -> int:
    """When the archived file was last written (its own mtime, never a link's target), read
    before it is shipped: what is shipped holds nothing written after it."""
    try:
        return os.lstat(dirs.wal / name).st_mtime_ns // 1000
    except FileNotFoundError:
        return 0


def _ship_wal(store: ObjectStore, dirs: HistoryDirs, name: str, key: str) -> str | None:
    """The archived file copied, as read (the tenant's: safely); None when it cannot be."""
    limit = MAX_SEGMENT if SEGMENT.fullmatch(name) else MAX_HISTORY_FILE
    try:
        fd = untrusted.open_regular(untrusted.under(dirs.wal, name))
    except FileNotFoundError:
        return None  # freed meanwhile
    except OSError as exc:  # a link, a FIFO: never shipped, so never replayed elsewhere
        _refused(dirs, name, f"is not a plain file: {exc}")
        return None
    with open(fd, "rb") as f:  # safe: opened by the untrusted reader (no link, no FIFO)
        if os.fstat(f.fileno()).st_size > limit:  # refused before a byte is read
            _refused(dirs, name, f"is larger than {limit} bytes")
            return None
        try:
            sent = store.write(key, f, max_bytes=limit)
        except ComputeError:
            if os.fstat(f.fileno()).st_size > limit:  # grown as it was read: the tenant's
                _refused(dirs, name, f"is larger than {limit} bytes")
                return None
            raise  # the store's: the round goes on and then says it
    if SEGMENT.fullmatch(name):
        try:
            holes.free_zero_tail(untrusted.under(dirs.wal, name))
        except OSError as exc:  # gone meanwhile, or not a plain file any more: kept as it is
            log.debug("the zero tail of %s of %s not freed: %s", name, dirs.wal, exc)
    return sent.sha256


def _refused(dirs: HistoryDirs, name: str, why: str) -> None:
    """Said once per file, not at every round (a tenant's plant would fill the log)."""
    said = (str(dirs.wal), name)
    if said in _said:
        return
    if len(_said) >= _MAX_SAID:
        _said.clear()
    _said.add(said)
    log.warning("archived WAL %s of %s %s: never shipped", name, dirs.wal, why)


def _ship_base(store: ObjectStore, base: Base, prefix: str, staging: Path) -> None:
    """A base state packed (a cold archive of its directory) and stored."""
    staging.mkdir(mode=0o700, parents=True, exist_ok=True)
    local = staging / f"base-{secrets.token_hex(4)}"
    try:
        manifest = archive.pack(base.path, local)
        _check_packed(base, manifest)
        cold.upload(store, prefix, local)
    finally:
        shutil.rmtree(local, ignore_errors=True)


def _check_packed(base: Base, manifest: archive.Manifest) -> None:
    """The files packed are the base state as it was taken (its ``base.json``'s checksums,
    against those the packing computed as it read them): a base state damaged here is never
    shipped, and one unpacked whole elsewhere (each file checked against the manifest) needs
    no second reading of a GB to be trusted (``fetch``)."""
    packed = {entry.path: entry.sha256 for entry in manifest.files}
    for rel, sha in base.files.items():
        if packed.get(f"pgdata/{rel}") != sha:
            raise ComputeError(
                f"base state {base.path.name} of {base.path.parent.parent}: pgdata/{rel} no"
                " longer matches its checksum; not shipped"
            )


def _free(store: ObjectStore, prefix: str, head: Head) -> int:
    """Objects of the branch that ``head`` does not name: freed here, or left by a crash. The
    bytes of those it names."""
    kept = {f"{prefix}/{HEAD}"}
    kept |= {f"{prefix}/wal/{name}" for name in head.wal}
    for name in head.bases:
        kept |= {f"{prefix}/base/{name}/{file}" for file in (*ARCHIVE_NAMES, MANIFEST_NAME)}
    # The WAL streamed past the newest segment shipped whole is kept: it is all there is of it.
    shipped_end = max((n[8:] for n in head.wal if SEGMENT.fullmatch(n)), default="")
    stored = 0
    for key, size in store.sizes(prefix).items():
        if key not in kept and not streaming.live(key, prefix, shipped_end):
            store.delete(key)
        else:
            stored += size
    return stored
