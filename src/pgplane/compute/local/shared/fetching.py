"""A branch's shipped history fetched back onto a node, for a rebuild there (``recover``,
``nodes recover``, ``backups verify``): the other half of :mod:`.shipping`.

Its newest base state and every WAL file from that base state's start on, each checked by its
checksum, then what was streamed past the newest segment shipped whole. The WAL is fetched
while the base state unpacks (each takes seconds for a GB, and neither fills both cores): the
base state's start, which says where the WAL it needs begins, is read from the archive's first
member first.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import shutil
import tarfile
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import BinaryIO, NamedTuple

import msgspec
from zstandard import ZstdError

from pgplane.compute.driver import ComputeError
from pgplane.compute.local.cold import archive
from pgplane.compute.local.cold.extract import tar_stream
from pgplane.compute.local.cold.manifest import archive_name
from pgplane.compute.local.files import fsync_dir, write_atomic, write_owned
from pgplane.compute.local.history.archiving import BASE_STATE, WAL_SUMS, HistoryDirs, list_bases
from pgplane.compute.local.history.wal import parse_segment, segment_name
from pgplane.compute.local.shared import cold, streaming
from pgplane.compute.local.shared.objects import ObjectStore
from pgplane.compute.local.shared.shipping import (
    HISTORY,
    MAX_HISTORY_FILE,
    MAX_SEGMENT,
    SEGMENT,
    Head,
    read_head,
)

log = logging.getLogger(__name__)

# WAL files fetched at once by a rebuild (botocore pools ten connections per client).
_FETCHERS = 8
# A base state's base.json: a checksum per file of the data (~1,300 in a new cluster).
_MAX_BASE_STATE = 64 << 20
# Reads of the streamed WAL that a segment's shipping beside may cut short (each time, one
# more segment was shipped whole: the next read starts past it).
_RACES = 8


class _Start(NamedTuple):
    """Where a base state's replay starts: the WAL it needs is from this LSN's segment on."""

    lsn: int
    segment_size: int


def fetch(
    store: ObjectStore, dirs: HistoryDirs, prefix: str, staging: Path, owner: tuple[int, int]
) -> bool:
    """The branch's newest shipped base state and every WAL file from its start on, put in
    its (empty or half-fetched) history here, each checked by its checksum; the WAL files
    ``owner``'s (the compute user's: its postmasters archive there, and a replay reads them).
    Whether the base state was unpacked now (each of its files checked as it was written:
    one an earlier attempt left is to be checked again). Raises ComputeError naming what is
    missing or damaged."""
    head = read_head(store, prefix)
    if head is None or not head.bases:
        raise ComputeError(f"branch {dirs.branch_dir.name} has no history on shared storage")
    newest = max(head.bases)
    base_dir = dirs.bases / newest
    dirs.bases.mkdir(mode=0o700, parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        dirs.wal.mkdir(mode=0o700)
    os.chown(dirs.wal, *owner, follow_symlinks=False)
    if (base_dir / BASE_STATE).is_file():  # unpacked whole by an earlier attempt
        base = next(b for b in list_bases(dirs) if b.path.name == newest)
        _fetch_wal(store, dirs, prefix, head, _Start(base.start_lsn, base.segment_size), owner)
        return False
    # Half unpacked (unpack renames it whole); root's: base/ is 0700.
    shutil.rmtree(base_dir, ignore_errors=True)
    staging.mkdir(mode=0o700, parents=True, exist_ok=True)
    local = staging / f"fetch-{secrets.token_hex(4)}"
    try:
        began = time.perf_counter()
        manifest = cold.download(store, f"{prefix}/base/{newest}", local)
        downloaded = time.perf_counter()
        start = _start_of(local, manifest.format)
        with ThreadPoolExecutor(1, thread_name_prefix="pgplane-fetch-wal") as beside:
            wal = beside.submit(_fetch_wal, store, dirs, prefix, head, start, owner)
            try:
                archive.unpack(local, base_dir)
            finally:
                unpacked_at = time.perf_counter()
                wal.result()  # its failure, else the unpack's (both finish first)
    finally:
        shutil.rmtree(local, ignore_errors=True)  # root's: the node's staging directory
    log.info(
        "base state %s of %s: downloaded in %.0f ms, unpacked in %.0f ms",
        newest,
        prefix,
        (downloaded - began) * 1000,
        (unpacked_at - downloaded) * 1000,
    )
    return True


def _start_of(local: Path, format_: int) -> _Start:
    """The base state's start, from the downloaded archive's ``base.json`` (its first file:
    a base state's directory holds it beside ``pgdata/``, and the archive lists names in
    order). The archive was checked whole as it was downloaded."""
    try:
        with (
            (local / archive_name(format_)).open("rb") as raw,  # root's: made by the download
            tarfile.open(fileobj=tar_stream(raw, format_), mode="r|") as tar,  # root's: it
        ):
            for member in tar:
                if member.name == BASE_STATE and member.isfile():
                    source = tar.extractfile(member)
                    if source is not None and member.size <= _MAX_BASE_STATE:
                        state = json.loads(source.read(member.size))
                        return _Start(int(state["start_lsn"]), int(state["segment_size"]))
                if member.name not in (".", BASE_STATE):
                    break
    except (
        OSError,
        EOFError,
        zlib.error,
        ZstdError,
        tarfile.TarError,
        ValueError,
        KeyError,
        TypeError,
    ) as exc:
        raise ComputeError(f"the base state archive {local.name} is unreadable: {exc}") from None
    raise ComputeError(f"the base state archive {local.name} has no {BASE_STATE} first")


def _fetch_wal(
    store: ObjectStore,
    dirs: HistoryDirs,
    prefix: str,
    head: Head,
    start: _Start,
    owner: tuple[int, int],
) -> None:
    """Every WAL file the base state's replay needs, then the catalog of their checksums."""
    began = time.perf_counter()
    wanted = _needed(head, start)
    _fetch_files(store, dirs, prefix, wanted, owner)
    # Then what was streamed past the newest segment shipped whole (partial, as a compute's
    # current segment is): the replay reads on to its last record.
    for _ in range(_RACES):
        try:
            wanted |= streaming.assemble(
                store,
                prefix,
                after=_shipped_end(wanted, start),
                segment_size=start.segment_size,
                dest=dirs.wal,
                owner=owner,
            )
            break
        except streaming.Freed:
            # Shipped whole meanwhile by the platform running beside: the head names it now.
            # Its file (and any after it) may have been rebuilt from pieces already: replaced.
            now = read_head(store, prefix)
            shipped = {} if now is None else _needed(now, start)
            newly = {name: sha for name, sha in shipped.items() if name not in wanted}
            _fetch_files(store, dirs, prefix, newly, owner, replace=True)
            wanted |= newly
    else:
        raise ComputeError(f"the WAL streamed for {prefix} kept going while it was read")
    fsync_dir(dirs.wal)
    log.info(
        "WAL of %s: %d files fetched in %.0f ms",
        prefix,
        len(wanted),
        (time.perf_counter() - began) * 1000,
    )
    # The catalog a replay checks each segment against: the checksums shipped with them.
    write_atomic(dirs.bases / WAL_SUMS, msgspec.json.encode(dict(sorted(wanted.items()))))


def _needed(head: Head, start: _Start) -> dict[str, str]:
    """The shipped WAL files a replay from ``start`` reads (and every timeline history)."""
    first = start.lsn // start.segment_size
    return {
        name: sha
        for name, sha in head.wal.items()
        if HISTORY.fullmatch(name) or parse_segment(name, start.segment_size)[1] >= first
    }


def _shipped_end(wanted: dict[str, str], start: _Start) -> str:
    """The newest segment shipped whole, past its timeline (``name[8:]``); none shipped:
    the one before the base state's first."""
    shipped_end = max((n[8:] for n in wanted if SEGMENT.fullmatch(n)), default="")
    if shipped_end:
        return shipped_end
    return segment_name(1, start.lsn // start.segment_size - 1, start.segment_size)[8:]


def _fetch_files(
    store: ObjectStore,
    dirs: HistoryDirs,
    prefix: str,
    names: dict[str, str],
    owner: tuple[int, int],
    *,
    replace: bool = False,
) -> None:
    # Several at once: each is a request's round trip, an unsealing and an fsync, and a
    # recovery waits for them all (a GB of WAL one by one took most of its time).
    with ThreadPoolExecutor(_FETCHERS, thread_name_prefix="pgplane-fetch") as pool:
        fetches = [
            pool.submit(
                _fetch_file, store, f"{prefix}/wal/{name}", dirs.wal / name, sha, owner, replace
            )
            for name, sha in sorted(names.items())
        ]
        for done in fetches:
            done.result()  # the first failure raised (the others finish: their files are whole)


def _fetch_file(
    store: ObjectStore, key: str, dest: Path, sha: str, owner: tuple[int, int], replace: bool
) -> None:
    if dest.exists() and not replace:  # an earlier attempt's (the replay checks its checksum)
        return
    limit = MAX_SEGMENT if SEGMENT.fullmatch(dest.name) else MAX_HISTORY_FILE
    write_owned(dest, lambda out: _read_checked(store, key, out, sha, limit), owner)


def _read_checked(store: ObjectStore, key: str, out: BinaryIO, sha: str, limit: int) -> None:
    name = key.rsplit("/", 1)[-1]
    try:
        got = store.read(key, out, max_bytes=limit)
    except FileNotFoundError:
        raise ComputeError(f"WAL file {name} is missing from shared storage") from None
    if got.sha256 != sha:
        raise ComputeError(f"WAL file {name} on shared storage does not match its checksum")
