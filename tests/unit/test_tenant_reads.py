"""Every file read on the compute side is either the safe reader's or says why it is root's own.

A tenant may hold its compute's OS user (DESIGN §6): a file in its data directory, WAL archive or
socket directory may be a link, a FIFO or gigabytes. Root reads those only through
``compute/local/tenants/untrusted.py``. This test finds every other way of opening a file under
``compute/local`` (``open``, ``Path.open``, ``read_text``, ``read_bytes``, ``os.open``): each must
carry, on its line or the line above, a comment saying whose file it is (``# root's``: a file
only root writes, or the kernel's; ``# safe:``: a tenant's file opened without following links and
without blocking, with the reason), or sit in a module listed below with the same. A new read of a
tenant's file made the plain way fails here until someone decides which it is.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "src" / "pgplane" / "compute" / "local"

# Modules whose every read is of root's own files, or is fd-based and link-safe by design.
MODULES = {
    "tenants/untrusted.py": "the safe reader itself",
    "cold/manifest.py": "the cold archive's files: archive/ is root's, 0700",
    "cold/archive.py": "packs and unpacks root's archives (archive/ is root's, 0700)",
    "cold/extract.py": "unpacks root's archive into a new root-made tree (O_NOFOLLOW, O_EXCL)",
    "cold/tree.py": "reads a detached project's tree with O_NOFOLLOW from directory fds",
    "copies/datacopy.py": "copies a tenant's data from directory fds, O_NOFOLLOW, regular files",
    "copies/spares.py": "spare/ is root's, 0700",
    "files.py": "fsyncs and atomic writes of paths the platform made (O_EXCL, O_NOFOLLOW)",
    "shared/objects.py": "shared storage (root's, 0700), opened from directory fds, O_NOFOLLOW,"
    " O_NONBLOCK, regular files, bounded",
    "shared/cold.py": "the shared store's objects (bounded, checked) and root's archive/",
    "shared/shipping.py": "the shared store's objects (bounded, checked); the tenant's WAL only"
    " through the untrusted reader",
    "shared/s3.py": "objects of the object store, no local file (bounded, checked by the caller)",
    "shared/sealed.py": "objects (bounded, authenticated) and the operator's archive key file"
    " (O_NONBLOCK, regular files only, refused when others may read it)",
}
READS = {"open", "read_text", "read_bytes"}


def _reads(tree: ast.AST) -> list[int]:
    lines = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Name) and func.id == "open":
            lines.append(node.lineno)
        elif isinstance(func, ast.Attribute) and func.attr in READS:
            if isinstance(func.value, ast.Name) and func.value.id == "untrusted":
                continue  # the safe reader's own
            lines.append(node.lineno)
    return lines


def _explained(source: list[str], lineno: int) -> bool:
    here = source[lineno - 1]
    above = source[lineno - 2] if lineno >= 2 else ""
    return any(mark in text for text in (here, above) for mark in ("# root's", "# safe:"))


def test_every_read_on_the_compute_side_says_whose_file_it_is() -> None:
    unexplained = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel in MODULES:
            continue
        text = path.read_text()
        source = text.splitlines()
        unexplained += [
            f"{rel}:{lineno}: {source[lineno - 1].strip()}"
            for lineno in _reads(ast.parse(text))
            if not _explained(source, lineno)
        ]
    assert not unexplained, "reads of files that may be a tenant's:\n" + "\n".join(unexplained)


def test_the_finder_finds_a_plain_read() -> None:
    sample = "from pathlib import Path\nmajor = (Path('x') / 'PG_VERSION').read_text()\n"
    assert _reads(ast.parse(sample)) == [2]
    assert not _explained(sample.splitlines(), 2)
    assert _explained([*sample.splitlines()[:1], "x.read_text()  # root's: ours"], 2)
