"""What a tenant is told never shows where the platform keeps things on the machine.

A compute's error often names a file by its absolute path (``/var/lib/pgplane/projects/…``):
the data directory's own path is cut from the messages operations record and the API answers
with, leaving the path inside it (``projects/…``). The logs keep it whole, for operators.
"""

from __future__ import annotations

from pathlib import Path

_hidden: list[str] = []


def hide(path: Path) -> None:
    """Cut ``path`` (as given, and resolved) from every message :func:`scrub` is given."""
    for form in {str(path), str(path.resolve())}:
        if form not in _hidden and form != "/":
            _hidden.append(form)
    _hidden.sort(key=len, reverse=True)  # the longest first: one may hold another


def scrub(text: str) -> str:
    for path in _hidden:
        if path in text:
            text = text.replace(path + "/", "").replace(path, "the data directory")
    return text
