"""The cold archive: a tree back byte for byte with its modes, or an error and nothing restored."""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import random
import stat
import tarfile
from collections.abc import Callable
from pathlib import Path

import msgspec
import pytest
import zstandard

from pgplane.compute.driver import ComputeError
from pgplane.compute.local.cold.archive import (
    ARCHIVE_NAME,
    FORMAT,
    MANIFEST_NAME,
    DirEntry,
    FileEntry,
    LinkEntry,
    Manifest,
    archive_name,
    pack,
    tree_checksums,
    unpack,
    verify,
)

BIG = 3 << 20  # more than one copy chunk, and large enough to start its writeback early


def build_tree(root: Path) -> Path:
    """A small project: two data directories (0700, 0750) among ordinary files."""
    rng = random.Random(1)
    files = {
        "storage.json": (b'{"history_retention_seconds": 86400}', 0o600),
        "endpoints/ep-1": (b"", 0o600),
        "branches/br-a/pgdata/PG_VERSION": (b"16\n", 0o600),
        "branches/br-a/pgdata/base/1/1259": (rng.randbytes(BIG), 0o600),
        "branches/br-a/pgdata/base/1/1259_fsm": (bytes(24576), 0o600),
        "branches/br-a/pgdata/global/pg_control": (rng.randbytes(8192), 0o600),
        "branches/br-a/pgdata/pg_wal/archive_status/.keep": (b"", 0o640),
        "branches/br-b/pgdata/PG_VERSION": (b"16\n", 0o640),
        "branches/br-b/pgdata/postgresql.conf": (b"port = 5432\n", 0o640),
        "branches/br-b/pgdata/base/5/16384": (rng.randbytes(100_000), 0o640),
        "branches/br-b/pgdata/pg_logical/replorigin_checkpoint": (b"", 0o600),
    }
    root.mkdir(parents=True)
    for rel, (data, mode) in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        path.write_bytes(data)
        path.chmod(mode)
    (root / "branches/br-b/pgdata/pg_tblspc").mkdir(mode=0o700)  # an empty directory
    (root / "branches/br-a/pgdata/current").symlink_to("base/1")
    (root / "branches/br-b/pgdata").chmod(0o750)
    (root / "branches/br-b/pgdata/base").chmod(0o750)
    (root / "endpoints").chmod(0o755)
    os.utime(root / "storage.json", (1_600_000_000.25, 1_600_000_000.25))
    root.chmod(0o750)
    return root


def entries(root: Path) -> dict[str, tuple[str, int, str | None]]:
    """Every entry under root: kind, mode, and a link's target."""
    found: dict[str, tuple[str, int, str | None]] = {
        ".": ("d", stat.S_IMODE(root.stat().st_mode), None)
    }
    for dirpath, dirnames, filenames in os.walk(root):  # links to directories not followed
        for name in dirnames + filenames:
            path = Path(dirpath, name)
            st = path.lstat()
            rel = path.relative_to(root).as_posix()
            if stat.S_ISLNK(st.st_mode):
                found[rel] = ("l", 0, os.readlink(path))
            else:
                kind = "d" if stat.S_ISDIR(st.st_mode) else "f"
                found[rel] = (kind, stat.S_IMODE(st.st_mode), None)
    return found


def leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if ".tmp-" in p.name)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    return build_tree(tmp_path / "projects" / "p-1")


def test_a_tree_comes_back_byte_for_byte_with_its_modes(tmp_path: Path, tree: Path) -> None:
    archive = tmp_path / "archive" / "p-1"  # its parent is made on the way
    packed = pack(tree, archive)
    assert sorted(p.name for p in archive.iterdir()) == [ARCHIVE_NAME, MANIFEST_NAME]
    assert packed.data_size == sum(len(p.read_bytes()) for p in tree.rglob("*") if p.is_file())
    assert {f.path for f in packed.files} == set(tree_checksums(tree))

    restored = tmp_path / "restored" / "p-1"
    restored.parent.mkdir()
    unpacked = unpack(archive, restored, owner=(os.getuid(), os.getgid()))

    assert unpacked == packed
    assert tree_checksums(restored) == tree_checksums(tree)
    assert entries(restored) == entries(tree)
    assert entries(restored)["branches/br-b/pgdata"] == ("d", 0o750, None)
    assert entries(restored)["branches/br-a/pgdata/current"] == ("l", 0, "base/1")
    assert (restored / "branches/br-a/pgdata/current/1259").stat().st_size == BIG
    # To the microsecond at least: a history dated by a stopped branch's files needs that.
    assert abs((restored / "storage.json").stat().st_mtime_ns - 1_600_000_000_250_000_000) < 1000
    assert leftovers(restored.parent) == []
    assert leftovers(archive.parent) == []


def test_the_manifest_records_each_entry(tmp_path: Path, tree: Path) -> None:
    manifest = pack(tree, tmp_path / "archive")
    assert manifest.dirs[0] == DirEntry(path=".", mode=0o750)
    files = {f.path: f for f in manifest.files}
    control = tree / "branches/br-a/pgdata/global/pg_control"
    assert files["branches/br-a/pgdata/global/pg_control"] == FileEntry(
        path="branches/br-a/pgdata/global/pg_control",
        size=8192,
        mode=0o600,
        sha256=hashlib.sha256(control.read_bytes()).hexdigest(),
    )
    assert files["endpoints/ep-1"].size == 0
    assert manifest.symlinks == (LinkEntry(path="branches/br-a/pgdata/current", target="base/1"),)
    data = (tmp_path / "archive" / ARCHIVE_NAME).read_bytes()
    assert manifest.archive_size == len(data)
    assert manifest.archive_sha256 == hashlib.sha256(data).hexdigest()
    on_disk = (tmp_path / "archive" / MANIFEST_NAME).read_bytes()
    assert msgspec.json.decode(on_disk, type=Manifest) == manifest
    assert verify(tmp_path / "archive") == manifest


def test_pack_converges_without_redoing_the_work(tmp_path: Path, tree: Path) -> None:
    archive = tmp_path / "archive"
    first = pack(tree, archive)
    written = (archive / ARCHIVE_NAME).stat()
    assert pack(tree, archive) == first
    again = (archive / ARCHIVE_NAME).stat()
    assert (again.st_ino, again.st_mtime_ns) == (written.st_ino, written.st_mtime_ns)
    # A retry after the tree was removed (detach crashed after packing) finds the archive.
    moved = tree.rename(tmp_path / "elsewhere")
    assert pack(tree, archive) == first
    assert tree_checksums(moved)


def test_pack_refuses_to_vouch_for_a_damaged_archive(tmp_path: Path, tree: Path) -> None:
    archive = tmp_path / "archive"
    pack(tree, archive)
    (archive / MANIFEST_NAME).unlink()
    with pytest.raises(ComputeError, match="incomplete"):
        pack(tree, archive)


def test_what_a_crash_left_is_removed(tmp_path: Path, tree: Path) -> None:
    stale = tmp_path / ".archive.tmp-0badc0de"
    (stale / "half").mkdir(parents=True)
    (stale / "half" / ARCHIVE_NAME).write_bytes(b"\x1f\x8b truncated")
    unrelated = tmp_path / ".other.tmp-0badc0de"
    unrelated.mkdir()
    pack(tree, tmp_path / "archive")
    assert not stale.exists()
    assert unrelated.exists()

    stale_restore = tmp_path / ".restored.tmp-12345678"
    stale_restore.mkdir(mode=0o700)
    unpack(tmp_path / "archive", tmp_path / "restored")
    assert not stale_restore.exists()
    assert tree_checksums(tmp_path / "restored") == tree_checksums(tree)


def test_a_corrupt_byte_is_caught_before_extraction(tmp_path: Path, tree: Path) -> None:
    archive = tmp_path / "archive"
    pack(tree, archive)
    data = bytearray((archive / ARCHIVE_NAME).read_bytes())
    data[len(data) // 2] ^= 0x01
    (archive / ARCHIVE_NAME).write_bytes(data)
    with pytest.raises(ComputeError, match=r"corrupt: .* has sha256"):
        verify(archive)
    with pytest.raises(ComputeError, match=r"corrupt: .* has sha256"):
        unpack(archive, tmp_path / "restored")
    assert not (tmp_path / "restored").exists()
    assert leftovers(tmp_path) == []


def test_a_truncated_archive_is_caught(tmp_path: Path, tree: Path) -> None:
    archive = tmp_path / "archive"
    pack(tree, archive)
    data = (archive / ARCHIVE_NAME).read_bytes()
    (archive / ARCHIVE_NAME).write_bytes(data[:-100])
    with pytest.raises(ComputeError, match=r"has \d+ bytes, its manifest says"):
        unpack(archive, tmp_path / "restored")
    assert not (tmp_path / "restored").exists()


def tamper(archive: Path, **changes: object) -> None:
    """Rewrite the manifest's entry for PG_VERSION of br-a; the archive stays as it is."""
    manifest = msgspec.json.decode((archive / MANIFEST_NAME).read_bytes(), type=Manifest)
    files = tuple(
        msgspec.structs.replace(f, **changes) if f.path.endswith("br-a/pgdata/PG_VERSION") else f
        for f in manifest.files
    )
    tampered = msgspec.structs.replace(manifest, files=files)
    (archive / MANIFEST_NAME).write_bytes(msgspec.json.encode(tampered))


@pytest.mark.parametrize(
    ("changes", "error"),
    [
        ({"sha256": hashlib.sha256(b"15\n").hexdigest()}, "PG_VERSION' is corrupt"),
        ({"mode": 0o644}, "PG_VERSION' does not match the manifest"),
        ({"size": 4}, "PG_VERSION' does not match the manifest"),
        ({"mode": 0o4755}, "set-id mode"),
        ({"path": "branches/br-a/pgdata/../../../PG_VERSION"}, "unsafe path"),
        ({"path": "/etc/PG_VERSION"}, "unsafe path"),
        ({"path": "storage.json"}, "listed twice"),
        ({"path": "branches/br-a/pgdata/PG_VERSION.old"}, "'branches/br-a/pgdata/PG_VERSION'"),
    ],
)
def test_a_tampered_manifest_entry_is_refused(
    tmp_path: Path, tree: Path, changes: dict[str, object], error: str
) -> None:
    archive = tmp_path / "archive"
    pack(tree, archive)
    tamper(archive, **changes)
    with pytest.raises(ComputeError, match=error):
        unpack(archive, tmp_path / "restored")
    assert not (tmp_path / "restored").exists()
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize(
    ("damage", "error"),
    [
        (lambda a: (a / MANIFEST_NAME).unlink(), "incomplete: it has no manifest"),
        (lambda a: (a / ARCHIVE_NAME).unlink(), f"incomplete: it has no {ARCHIVE_NAME}"),
        (lambda a: (a / MANIFEST_NAME).write_bytes(b'{"format": 1'), "unreadable manifest"),
        (lambda a: (a / MANIFEST_NAME).write_bytes(b"{}"), "unreadable manifest"),
        (lambda a: (a / MANIFEST_NAME).write_text("[]"), "unreadable manifest"),
    ],
)
def test_an_incomplete_archive_is_refused(
    tmp_path: Path, tree: Path, damage: Callable[[Path], object], error: str
) -> None:
    archive = tmp_path / "archive"
    pack(tree, archive)
    damage(archive)
    with pytest.raises(ComputeError, match=error):
        unpack(archive, tmp_path / "restored")
    assert not (tmp_path / "restored").exists()


def test_a_missing_archive_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ComputeError, match="is missing"):
        unpack(tmp_path / "nowhere", tmp_path / "restored")


def test_unpack_never_replaces_a_tree(tmp_path: Path, tree: Path) -> None:
    archive = tmp_path / "archive"
    pack(tree, archive)
    (tmp_path / "restored").mkdir()
    with pytest.raises(ComputeError, match="it exists"):
        unpack(archive, tmp_path / "restored")
    assert list((tmp_path / "restored").iterdir()) == []


def test_pack_refuses_what_could_not_be_restored(tmp_path: Path, tree: Path) -> None:
    (tree / "escape").symlink_to("../../secrets")
    with pytest.raises(ComputeError, match="not a relative path inside the tree"):
        pack(tree, tmp_path / "archive")
    (tree / "escape").unlink()
    (tree / "absolute").symlink_to(tree / "storage.json")
    with pytest.raises(ComputeError, match="not a relative path inside the tree"):
        pack(tree, tmp_path / "archive")
    (tree / "absolute").unlink()
    os.mkfifo(tree / "fifo")
    with pytest.raises(ComputeError, match="not a regular file, directory or symlink"):
        pack(tree, tmp_path / "archive")
    assert not (tmp_path / "archive").exists()
    assert leftovers(tmp_path) == []
    with pytest.raises(ComputeError, match="not a directory"):
        pack(tmp_path / "nowhere", tmp_path / "archive")
    with pytest.raises(ComputeError, match="inside it"):
        pack(tree, tree / "archive")


# -- hostile archives ---------------------------------------------------------------------------


def member(
    name: str, kind: bytes = tarfile.REGTYPE, data: bytes = b"", **attrs: object
) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.mode = 0o700 if kind == tarfile.DIRTYPE else 0o600
    info.size = len(data) if kind == tarfile.REGTYPE else 0
    for key, value in attrs.items():
        setattr(info, key, value)
    return info, data


def forge(
    archive: Path,
    members: list[tuple[tarfile.TarInfo, bytes]],
    dirs: tuple[DirEntry, ...] = (),
    files: tuple[FileEntry, ...] = (),
    symlinks: tuple[LinkEntry, ...] = (),
    format_: int = FORMAT,
) -> None:
    """An archive written by hand, with a manifest whose archive checksum matches it: of this
    version's format (zstandard), or of format 1 (gzip), which earlier versions wrote."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in [member(".", tarfile.DIRTYPE), *members]:
            tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
    if format_ == 1:
        data = gzip.compress(buffer.getvalue())
    else:
        data = zstandard.ZstdCompressor().compress(buffer.getvalue())
    archive.mkdir()
    (archive / archive_name(format_)).write_bytes(data)
    manifest = Manifest(
        format=format_,
        archive_size=len(data),
        archive_sha256=hashlib.sha256(data).hexdigest(),
        dirs=(DirEntry(path=".", mode=0o700), *dirs),
        files=files,
        symlinks=symlinks,
    )
    (archive / MANIFEST_NAME).write_bytes(msgspec.json.encode(manifest))


def file_entry(path: str, data: bytes) -> FileEntry:
    return FileEntry(path=path, size=len(data), mode=0o600, sha256=hashlib.sha256(data).hexdigest())


@pytest.mark.parametrize("format_", [1, FORMAT])
def test_a_forged_archive_that_is_well_formed_restores(tmp_path: Path, format_: int) -> None:
    # The control for the tests below: what they refuse is their hostile member, not the forgery.
    # Format 1 (gzip) is what earlier versions wrote: their archives restore as they were.
    forge(
        tmp_path / "archive",
        [
            member("d", tarfile.DIRTYPE, mode=0o750),
            member("d/f", data=b"x"),
            member("d/l", tarfile.SYMTYPE, linkname="f"),
        ],
        dirs=(DirEntry(path="d", mode=0o750),),
        files=(file_entry("d/f", b"x"),),
        symlinks=(LinkEntry(path="d/l", target="f"),),
        format_=format_,
    )
    unpack(tmp_path / "archive", tmp_path / "restored")
    assert entries(tmp_path / "restored") == {
        ".": ("d", 0o700, None),
        "d": ("d", 0o750, None),
        "d/f": ("f", 0o600, None),
        "d/l": ("l", 0, "f"),
    }
    assert (tmp_path / "restored/d/l").read_bytes() == b"x"


@pytest.mark.parametrize(
    ("members", "error"),
    [
        ([member("../evil", data=b"pwned")], "'../evil' has an unsafe path"),
        ([member("/tmp/evil", data=b"pwned")], "'/tmp/evil' has an unsafe path"),
        ([member("a/../../evil", data=b"pwned")], "unsafe path"),
        ([member("./evil", data=b"pwned")], "unsafe path"),
        ([member("evil", tarfile.LNKTYPE, linkname="/etc/passwd")], "not a regular file"),
        ([member("evil", tarfile.SYMTYPE, linkname="/etc/passwd")], "does not match"),
        ([member("evil", tarfile.SYMTYPE, linkname="../..")], "does not match"),
        ([member("evil", tarfile.CHRTYPE, devmajor=1, devminor=3)], "not a regular file"),
        ([member("evil", tarfile.FIFOTYPE)], "not a regular file"),
        ([member("evil", data=b"unlisted")], "'evil' does not match the manifest"),
        ([member("d/evil", data=b"x")], "comes before its directory"),
        ([member(".", tarfile.DIRTYPE)], "appears twice"),
    ],
)
def test_hostile_members_are_refused(
    tmp_path: Path, members: list[tuple[tarfile.TarInfo, bytes]], error: str
) -> None:
    root = tmp_path / "deep" / "down"
    root.mkdir(parents=True)
    forge(root / "archive", members)
    with pytest.raises(ComputeError, match=error):
        unpack(root / "archive", root / "restored")
    assert not (root / "restored").exists()
    assert leftovers(root) == []
    assert sorted(p.name for p in tmp_path.rglob("*evil*")) == []


@pytest.mark.parametrize(
    ("link", "target"),
    [
        ("evil", "/etc"),
        ("evil", ".."),
        ("d/evil", "../.."),
        ("evil", "d/l/.."),  # climbs out through d/l -> .. if the kernel follows d/l first
        ("evil", "d/../.."),
        ("evil", "./d"),
    ],
)
def test_links_that_could_lead_out_are_refused(tmp_path: Path, link: str, target: str) -> None:
    forge(
        tmp_path / "archive",
        [member("d", tarfile.DIRTYPE), member(link, tarfile.SYMTYPE, linkname=target)],
        dirs=(DirEntry(path="d", mode=0o700),),
        symlinks=(LinkEntry(path=link, target=target),),
    )
    with pytest.raises(ComputeError, match="out of the tree"):
        unpack(tmp_path / "archive", tmp_path / "restored")
    assert not (tmp_path / "restored").exists()


def test_links_that_stay_inside_are_restored(tmp_path: Path) -> None:
    links = {"d/up": "..", "d/l": "../d", "top": "d/up/d", "self": "."}
    forge(
        tmp_path / "archive",
        [
            member("d", tarfile.DIRTYPE),
            *(member(path, tarfile.SYMTYPE, linkname=target) for path, target in links.items()),
        ],
        dirs=(DirEntry(path="d", mode=0o700),),
        symlinks=tuple(LinkEntry(path=path, target=target) for path, target in links.items()),
    )
    unpack(tmp_path / "archive", tmp_path / "restored")
    for path, target in links.items():
        assert os.readlink(tmp_path / "restored" / path) == target


def test_a_manifest_entry_missing_from_the_archive_is_caught(tmp_path: Path) -> None:
    forge(
        tmp_path / "archive",
        [member("a", data=b"a")],
        files=(file_entry("a", b"a"), file_entry("b", b"b")),
    )
    with pytest.raises(ComputeError, match="lacks 1 entries of its manifest, such as 'b'"):
        unpack(tmp_path / "archive", tmp_path / "restored")
    assert not (tmp_path / "restored").exists()
    assert leftovers(tmp_path) == []
