"""What ``serve`` checks of the paths it is given before it makes anything (the data
directory, the store, a certificate authority, the node): a missing certificate was found
after all of them, as a traceback. Each problem names the flag (and variable) to fix."""

from __future__ import annotations

import os
import ssl
from pathlib import Path

from pgplane.config import Settings


class Unusable(ValueError):
    """A path ``serve`` was given cannot serve; the message names its flag."""


def check_paths(settings: Settings) -> None:
    """Unusable for the first path that cannot serve as given."""
    _data_dir(settings.data_dir)
    if settings.tls_cert is not None and settings.tls_key is not None:
        _tls_pair(settings.tls_cert, settings.tls_key)
    if settings.object_store is not None and settings.archive_key_file is not None:
        from pgplane.compute.local.shared.sealed import load_archive_key  # noqa: PLC0415

        try:
            load_archive_key(settings.archive_key_file)
        except ValueError as exc:
            raise Unusable(f"--archive-key-file (PGPLANE_ARCHIVE_KEY_FILE): {exc}") from None
    if settings.shared_dir is not None and not settings.shared_dir.is_dir():
        raise Unusable(f"--shared-dir {settings.shared_dir}: not a directory")
    for bin_dir in settings.pg_bin_dirs:
        if not bin_dir.is_dir():
            raise Unusable(f"PGPLANE_PG_BIN_DIRS: {bin_dir} is not a directory")


def _data_dir(path: Path) -> None:
    """The data directory, or the nearest directory above it that exists, is ours to write."""
    if path.exists() and not path.is_dir():
        raise Unusable(f"--data-dir {path}: not a directory")
    existing = path
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise Unusable(f"--data-dir {path}: {existing} is not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        where = "" if existing == path else f" ({existing} cannot be written to make it)"
        raise Unusable(f"--data-dir {path}: not writable by this user{where}")


def _tls_pair(cert: Path, key: Path) -> None:
    for flag, path in (("--tls-cert", cert), ("--tls-key", key)):
        if not path.is_file():
            raise Unusable(f"{flag} {path}: no such file")
        if not os.access(path, os.R_OK):
            raise Unusable(f"{flag} {path}: not readable by this user")
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(cert, key)
    except ssl.SSLError as exc:
        raise Unusable(
            f"--tls-cert {cert} and --tls-key {key} are not a PEM certificate and its key:"
            f" {exc.reason or exc}"
        ) from None
