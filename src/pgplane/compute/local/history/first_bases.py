"""A new cluster's first base state: the template its data is copied from.

Every new cluster (a project's root branch, a schema-only branch) starts as a copy of its
version's template and is built archiving, so its history goes on from the template: its first
base state is the template itself. That base state is staged before the cluster is copied, and
the cluster is copied from it:

- where the template's files can be linked (the data directory's own filesystem), it is links
  to them: nothing is copied for it;
- else (a project on a filesystem of its own) it is a copy of the template, and the cluster a
  copy of that copy: a clone where the filesystem clones (XFS), so the template's bytes are
  written once, not twice.

It is published once the cluster is built, with the template's checksums: those are taken once
per template, not per cluster (hashing a template's 40 MB was a third of a project's creation,
and copying the new cluster's data for its base state, where links could not be made, another).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
from collections.abc import AsyncIterator, Mapping
from pathlib import Path

from pgplane.compute.driver import ComputeError
from pgplane.compute.local.files import copy_tree
from pgplane.compute.local.history.archiving import HistoryDirs
from pgplane.compute.local.history.bases import checksums, fresh_tmp, publish_base, stopped_by
from pgplane.compute.local.history.wal import read_control_data
from pgplane.compute.local.postgres.binaries import PgInstall
from pgplane.compute.local.tenants.user import RunAs

log = logging.getLogger(__name__)


class TemplateSums:
    """Each template's checksums, taken the first time a cluster copies it. A template is never
    written once built; one rebuilt (new binaries, at start-up) has a new control file, and its
    sums are taken again."""

    def __init__(self) -> None:
        self._known: dict[Path, tuple[int, Mapping[str, str]]] = {}

    async def of(self, template: Path) -> Mapping[str, str]:
        built = (await asyncio.to_thread(os.stat, template / "global" / "pg_control")).st_mtime_ns
        known = self._known.get(template)
        if known is not None and known[0] == built:
            return known[1]
        sums = await asyncio.to_thread(lambda: dict(checksums(template)))
        self._known[template] = built, sums
        return sums


@contextlib.asynccontextmanager
async def staged_first_base(
    dirs: HistoryDirs,
    install: PgInstall,
    template: Path,
    template_owner: RunAs,
    sums: TemplateSums,
) -> AsyncIterator[Path]:
    """The template staged as the branch's first base state; yields the directory to copy the
    new cluster from. Published once the body returns (the cluster built), removed if it
    raises. The caller holds the branch's base lock throughout: the keeper, which sweeps
    unfinished base states, waits."""
    control = await read_control_data(install, template_owner, template)
    tmp = await asyncio.to_thread(fresh_tmp, dirs)
    staged = tmp / "pgdata"
    try:
        try:
            await asyncio.to_thread(_link_tree, template, staged)
        except OSError as exc:
            log.info("the template cannot be linked into %s (%s): copied", dirs.branch_dir, exc)
            await asyncio.to_thread(shutil.rmtree, staged, True)
            await copy_tree(template, staged)
        yield staged
        await asyncio.to_thread(
            publish_base,
            dirs,
            tmp,
            start_lsn=control.redo,
            end_lsn=control.checkpoint,
            end_time=stopped_by(template),
            segment_size=control.segment_size,
            files=await sums.of(template),
        )
    except BaseException:
        await asyncio.shield(asyncio.to_thread(shutil.rmtree, tmp, True))
        raise


def _link_tree(src: Path, dst: Path) -> None:
    for dirpath, _, names in os.walk(src):
        target = dst / os.path.relpath(dirpath, src)
        target.mkdir(mode=0o700)
        for name in names:
            path = os.path.join(dirpath, name)
            if not os.path.isfile(path) or os.path.islink(path):
                raise ComputeError(f"{path} is not a regular file")
            os.link(path, target / name, follow_symlinks=False)
