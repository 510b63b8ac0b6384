"""The system calls a sandboxed compute is refused: a seccomp filter bwrap installs last.

A tenant holding its compute's OS user runs programs in the sandbox. Without a filter it can
make user namespaces there (``unshare -U``), and inside one it holds every capability over
namespaces of its own: the kernel's namespace code, a large part of its attack surface, opens
to it. Postgres never needs them, nor the other calls refused here (keys, BPF, perf events,
io_uring, module loading, mounts, swap, reboot, file handles). The filter, as flatpak and
Docker build theirs: ``unshare`` and ``clone`` with ``CLONE_NEWUSER`` fail with EPERM, and
``clone3`` with ENOSYS (its flags sit in memory a filter cannot read; glibc falls back to
``clone``); everything else is allowed.

Built with libseccomp (the system's ``libseccomp.so.2``, which apt itself depends on on every
Debian and Ubuntu) through pyseccomp, its ctypes binding; written once per start into the
sandbox's root-owned directory, and handed to bwrap (``--seccomp``) on an inherited descriptor.
"""

from __future__ import annotations

import errno
import os
import secrets
from pathlib import Path

CLONE_NEWUSER = 0x10000000
# Calls a compute never makes, refused outright (those this machine's kernel does not know are
# skipped).
_REFUSED = (
    "add_key",
    "keyctl",
    "request_key",
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "init_module",
    "finit_module",
    "delete_module",
    "kexec_load",
    "kexec_file_load",
    "mount",
    "umount2",
    "pivot_root",
    "swapon",
    "swapoff",
    "reboot",
    "acct",
    "name_to_handle_at",
    "open_by_handle_at",
)


def write_filter(path: Path) -> str | None:
    """The filter's BPF program written to ``path`` (root's, 0600); None, or why it cannot be
    (no libseccomp here: computes are sandboxed without it, and the start-up log says so)."""
    try:
        import pyseccomp  # type: ignore[import-untyped]  # noqa: PLC0415 - loads libseccomp.so.2 where a sandbox is made
    except (ImportError, OSError, RuntimeError) as exc:
        return f"no libseccomp ({exc})"
    try:
        rules = pyseccomp.SyscallFilter(pyseccomp.ALLOW)
        newuser = pyseccomp.Arg(0, pyseccomp.MASKED_EQ, CLONE_NEWUSER, CLONE_NEWUSER)
        for call in ("unshare", "clone"):
            rules.add_rule(pyseccomp.ERRNO(errno.EPERM), call, newuser)
        rules.add_rule(pyseccomp.ERRNO(errno.ENOSYS), "clone3")
        for call in _REFUSED:
            try:
                rules.add_rule(pyseccomp.ERRNO(errno.EPERM), call)
            except (RuntimeError, ValueError, OSError):
                continue  # not a call of this architecture
        tmp = path.with_name(f".{path.name}.tmp-{secrets.token_hex(4)}")
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        # root's: made here, O_EXCL (libseccomp writes the program to a descriptor)
        with open(os.open(tmp, flags, 0o600), "wb") as out:
            rules.export_bpf(out)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except (RuntimeError, ValueError, OSError) as exc:
        return f"libseccomp could not build the filter ({exc})"
    return None
