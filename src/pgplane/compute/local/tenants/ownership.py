"""Giving a tree to a project's user, as root, without being led out of it.

Root changes owners in trees that a tenant may have held: a copy or a restore it built itself
(a branch, a reattach), or a data directory of an earlier version owned by the shared compute
user. A tenant that is superuser on its compute owns files as its OS user and may plant
symbolic links or hard links, or swap a directory for a link between our look and our act. So:

- the walk is ``os.fwalk`` without following links: every directory is opened relative to its
  parent's descriptor (``O_NOFOLLOW``), every change is made relative to it; a link is never
  followed, only skipped;
- bottom-up: a directory is given away only after everything in it, so while root works in a
  directory nobody else can change what it holds (a tree root built is root's until its top
  changes hands, last);
- only entries owned by one of ``from_uids`` change hands, and only directories and regular
  files with one link: a hard link planted to a file elsewhere (owned by root or another
  project) is left alone, as is anything that is not a file or a directory. A file whose every
  link lies inside the trees being handed over (``linked_within``) is the project's own and
  changes hands too: a data directory's completed WAL segment, hard-linked into its branch's
  archive until a checkpoint unlinks it, would otherwise stay unreadable to its postmaster.

The top directory changes hands last, so its owner says whether a walk completed: an
interrupted one is simply done again.
"""

from __future__ import annotations

import logging
import os
import stat
from collections import Counter
from collections.abc import Collection
from pathlib import Path

from pgplane.compute.local.tenants.user import RunAs

log = logging.getLogger(__name__)


def hand_over(
    top: Path, from_uids: Collection[int], run_as: RunAs, *, linked_within: Collection[Path] = ()
) -> int:
    """Give ``top`` and what it holds (owned by ``from_uids``) to ``run_as``; entries changed.

    A file of several links changes hands only if each is in ``top`` or ``linked_within``.
    """
    if not run_as.switch:
        return 0
    uid, gid = run_as.uid, run_as.gid
    inside = _links_inside([top, *linked_within]) if linked_within else Counter[tuple[int, int]]()
    changed = 0
    skipped: list[str] = []
    for dirpath, dirnames, filenames, dir_fd in os.fwalk(top, topdown=False, follow_symlinks=False):
        for name in [*filenames, *dirnames]:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            if (st.st_uid, st.st_gid) == (uid, gid):
                continue
            links_all_inside = st.st_nlink == 1 or inside[st.st_dev, st.st_ino] == st.st_nlink
            regular_file = stat.S_ISREG(st.st_mode) and links_all_inside
            if st.st_uid not in from_uids or not (regular_file or stat.S_ISDIR(st.st_mode)):
                skipped.append(os.path.join(dirpath, name))
                continue
            os.chown(name, uid, gid, dir_fd=dir_fd, follow_symlinks=False)
            changed += 1
    st = os.lstat(top)
    if stat.S_ISDIR(st.st_mode) and (st.st_uid, st.st_gid) != (uid, gid) and st.st_uid in from_uids:
        os.chown(top, uid, gid, follow_symlinks=False)
        changed += 1
    if skipped:
        log.warning(
            "left %d entries under %s to their owners (links, special files or others' files), "
            "such as %s",
            len(skipped),
            top,
            skipped[0],
        )
    return changed


def _links_inside(tops: Collection[Path]) -> Counter[tuple[int, int]]:
    """How many links of each file of several links the trees hold (links never followed)."""
    found: Counter[tuple[int, int]] = Counter()
    for top in tops:
        try:
            if not stat.S_ISDIR(os.lstat(top).st_mode):
                continue
        except FileNotFoundError:
            continue
        for _, _, filenames, dir_fd in os.fwalk(top, follow_symlinks=False):
            for name in filenames:
                st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
                if stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
                    found[st.st_dev, st.st_ino] += 1
    return found


def owned_by(path: Path, run_as: RunAs) -> bool:
    """Whether ``path`` itself belongs to ``run_as`` (a tree handed over is, at its top)."""
    return not run_as.switch or os.lstat(path).st_uid == run_as.uid
