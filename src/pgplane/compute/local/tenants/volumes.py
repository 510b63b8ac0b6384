"""A filesystem of its own per project: its disk share, which nothing it writes can pass.

As root (with the walls on), each project's directory is the mount point of a filesystem made
for it alone, in an image file under ``<data_dir>/volumes/`` loop-mounted there (``nodev``,
``nosuid``). Its branches' data, their WAL, the archive of its history and every copy made
for it live inside, so a tenant that fills its share fills its own filesystem: its own
Postgres then fails to write (its SQL errors, or a PANIC and a restart, until it frees space),
and every other project and the platform's own files keep theirs.

XFS when ``mkfs.xfs`` is installed (Debian's ``xfsprogs``): it clones files (reflink), so a
branch's copy of its parent (copies/datacopy.py's FICLONE) shares the parent's blocks and
costs neither time nor space until either writes. Otherwise ext4 (``mke2fs`` is in every
Debian), whose copies are real copies. The image is sparse: a project's share is a cap, not a
reservation, and the disk holds what the projects really wrote.

Crash safety: an image is made under a temporary name and renamed into place only once its
filesystem is whole; every image found at start-up is mounted again on its project's
directory before anything reads it. Removal unmounts lazily (a root thread still reading a
file cannot make a delete fail), then deletes the image.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from pgplane.compute.driver import ComputeError
from pgplane.compute.local.files import fsync_dir
from pgplane.compute.local.layout import check_id, ensure_dir

log = logging.getLogger(__name__)

_SUFFIX = ".img"
_TEMPORARY = ".tmp-"
# mkfs.xfs refuses filesystems under 300 MB.
MIN_BYTES = 512 << 20
_OPTIONS = "nodev,nosuid,noatime"


@dataclass(frozen=True, slots=True)
class Volumes:
    """The projects' filesystems: where their images live, how big, of which kind."""

    images: Path
    size_bytes: int
    fstype: str | None  # None: no volumes (projects share the data directory's disk)

    @classmethod
    def find(cls, images: Path, *, size_bytes: int, enabled: bool) -> Volumes:
        """This machine's volumes, or none; what is missing is logged as a warning."""
        if not enabled or os.geteuid() != 0:
            return cls(images, size_bytes, None)
        if size_bytes <= 0:
            log.warning("projects have no disk share: turned off (PGPLANE_DISK_PER_PROJECT=0)")
            return cls(images, size_bytes, None)
        if size_bytes < MIN_BYTES:
            raise ComputeError(
                f"a project's disk share of {size_bytes >> 20} MiB is too small:"
                f" at least {MIN_BYTES >> 20} MiB"
            )
        missing = [tool for tool in ("mount", "umount", "losetup") if shutil.which(tool) is None]
        fstype = (
            "xfs" if shutil.which("mkfs.xfs") else "ext4" if shutil.which("mkfs.ext4") else None
        )
        if missing or fstype is None:
            tools = ", ".join(missing) if missing else "mkfs.xfs or mkfs.ext4"
            log.warning(
                "projects have no disk share (%s not found): a tenant can fill the disk its"
                " data lives on",
                tools,
            )
            return cls(images, size_bytes, None)
        log.info(
            "projects have a disk share each: %d MiB on %s (%s)",
            size_bytes >> 20,
            fstype,
            "branch copies are clones" if fstype == "xfs" else "install xfsprogs for clones",
        )
        return cls(images, size_bytes, fstype)

    @property
    def active(self) -> bool:
        return self.fstype is not None

    def image(self, project_id: str) -> Path:
        return self.images / f"{check_id('project id', project_id)}{_SUFFIX}"

    def ensure(self, project_id: str, project_dir: Path) -> None:
        """The project's filesystem, made if missing, mounted on ``project_dir`` (blocking)."""
        if not self.active or os.path.ismount(project_dir):
            return
        image = self.image(project_id)
        if not image.exists():
            if _has_files(project_dir):
                return  # made before volumes were on: it stays on the data directory's disk
            self._make(image)
        with contextlib.suppress(FileExistsError):
            project_dir.mkdir(mode=0o700)
        if _has_files(project_dir):
            # Files under the mount point would vanish behind the mount: never ours to hide.
            raise ComputeError(f"cannot mount {image.name}: {project_dir} is not empty")
        _mount(image, project_dir)

    def mount_all(self, projects: Path) -> None:
        """At start-up: every project's filesystem on its directory; half-made images removed."""
        if not self.active or not self.images.is_dir():
            return
        for entry in sorted(self.images.iterdir()):
            if entry.name.startswith(_TEMPORARY):
                entry.unlink(missing_ok=True)
            elif entry.name.endswith(_SUFFIX):
                project_id = entry.name.removesuffix(_SUFFIX)
                project_dir = projects / check_id("project id", project_id)
                self.ensure(project_id, project_dir)
                if entry.stat().st_size < self.size_bytes:
                    self._grow(entry, project_dir)

    def _grow(self, image: Path, project_dir: Path) -> None:
        """A share raised since the image was made: the image and its filesystem grown to it,
        online (XFS and ext4 both grow mounted). A share lowered leaves images as they are:
        neither filesystem shrinks."""
        found = subprocess.run(
            ["findmnt", "-n", "-o", "SOURCE,FSTYPE", "--mountpoint", str(project_dir)],
            capture_output=True,
            text=True,
            check=False,
        )
        device, _, fstype = found.stdout.strip().partition(" ")
        if not device.startswith("/dev/loop"):
            log.warning("cannot grow %s: its mount point shows no loop device", image.name)
            return
        with open(image, "r+b") as f:  # root's
            f.truncate(self.size_bytes)
        _run(["losetup", "--set-capacity", device])
        if fstype.strip() == "xfs":
            _run(["xfs_growfs", str(project_dir)])
        else:
            _run(["resize2fs", device])
        log.info("%s grown to %d MiB", image.name, self.size_bytes >> 20)

    def has(self, project_id: str, project_dir: Path) -> bool:
        """Whether the project lives on a filesystem of its own (a project made before volumes
        were on keeps living in the data directory)."""
        return self.active and (os.path.ismount(project_dir) or self.image(project_id).exists())

    def remove(self, project_id: str, project_dir: Path) -> None:
        """Unmount the project's filesystem, delete its image and the mount point (blocking).

        Its computes and processes are stopped: whatever still holds a file open (a root
        thread finishing a read) keeps the filesystem until it closes, and the kernel frees
        the loop device then.
        """
        if os.path.ismount(project_dir):
            _run(["umount", "--lazy", str(project_dir)])
        self.image(project_id).unlink(missing_ok=True)
        with contextlib.suppress(FileNotFoundError):
            project_dir.rmdir()

    def _make(self, image: Path) -> None:
        ensure_dir(self.images, 0o700)
        tmp = self.images / f"{_TEMPORARY}{secrets.token_hex(4)}{_SUFFIX}"
        try:
            with open(tmp, "xb") as f:  # root's
                f.truncate(self.size_bytes)  # sparse: a cap, not a reservation
            if self.fstype == "xfs":
                _run(["mkfs.xfs", "-q", "-m", "reflink=1", str(tmp)])
            else:
                _run(["mkfs.ext4", "-q", "-F", "-m", "0", "-E", "nodiscard", str(tmp)])
            with open(tmp, "rb") as f:  # root's
                os.fsync(f.fileno())
            os.replace(tmp, image)
            fsync_dir(self.images)
        finally:
            tmp.unlink(missing_ok=True)


def _mount(image: Path, project_dir: Path) -> None:
    """The image's filesystem mounted on ``project_dir``, through a loop device doing direct
    I/O on the image: without it every page the project reads or writes is cached twice, in
    its filesystem and in the image file (a GB unpacked onto a fresh one took 2.75-3.0 s,
    2.46-2.61 s with it). Where the image's filesystem cannot (tmpfs), the device caches as
    before."""
    found = subprocess.run(
        ["losetup", "--direct-io=on", "--find", "--show", str(image)],
        capture_output=True,
        text=True,
        check=False,
    )
    device = found.stdout.strip()
    if found.returncode != 0 or not device.startswith("/dev/loop"):
        said = found.stderr.strip().splitlines()
        raise ComputeError(f"losetup failed: {said[-1] if said else found.returncode}")
    if found.stderr.strip():  # direct I/O refused (it says why): the device works without
        log.info("%s: %s", image.name, found.stderr.strip().splitlines()[-1])
    try:
        # Its type found by mount: an image made before xfsprogs was installed is ext4.
        _run(["mount", "-o", _OPTIONS, device, str(project_dir)])
    except ComputeError:
        with contextlib.suppress(ComputeError):  # the mount's error is the one to say
            _run(["losetup", "--detach", device])
        raise
    # Detached now: while it is mounted the kernel only marks it to be freed at the unmount
    # (autoclear, as mount's own -o loop does).
    _run(["losetup", "--detach", device])


def _has_files(directory: Path) -> bool:
    try:
        return any(directory.iterdir())
    except FileNotFoundError:
        return False


def _run(argv: list[str]) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip().splitlines()
        raise ComputeError(f"{argv[0]} failed: {said[-1] if said else done.returncode}")
