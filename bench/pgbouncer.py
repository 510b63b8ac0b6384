"""Debian's pgbouncer in session mode in front of a compute: the peer a user would put there.

Installed with apt when missing (as root); run as the compute's own OS user, so it reaches the
compute's private socket as the proxy does, and authenticating clients with SCRAM as the proxy
does (the role's password in its user list). Plaintext, and TLS with the platform's own proxy
certificate when the caller asks for it.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from bench.common import free_port


def _found() -> str | None:
    return shutil.which("pgbouncer") or (
        "/usr/sbin/pgbouncer" if os.path.exists("/usr/sbin/pgbouncer") else None
    )


def has_pgbouncer() -> bool:
    """Whether pgbouncer is here already (nothing installed to know)."""
    return _found() is not None


def binary() -> str:
    found = _found()
    if found is not None:
        return found
    if os.geteuid() != 0:
        raise SystemExit("pgbouncer is missing: run 'sudo apt-get install pgbouncer' first")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "-q", "pgbouncer"]
    if subprocess.run(install, env=env, capture_output=True, check=False).returncode != 0:
        subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True, check=True)
        subprocess.run(install, env=env, capture_output=True, check=True)
    return "/usr/sbin/pgbouncer"


@contextlib.contextmanager
def pgbouncer(
    *,
    socket_dir: Path,
    port: int,
    database: str,
    role: str,
    password: str,
    tls: tuple[Path, Path] | None = None,
) -> Iterator[tuple[int, int]]:
    """A session-mode pgbouncer for ``database`` on the compute at ``socket_dir``/``port``;
    yields the port it listens on (127.0.0.1) and its process id."""
    exe = binary()
    owner = pwd.getpwuid(socket_dir.stat().st_uid).pw_name
    listen = free_port()
    with tempfile.TemporaryDirectory(prefix="pgplane-bench-bouncer-") as tmp:
        work = Path(tmp)
        (work / "users.txt").write_text(f'"{role}" "{password}"\n')
        lines = [
            "[databases]",
            f"{database} = host={socket_dir} port={port} dbname={database}",
            "[pgbouncer]",
            f"listen_addr = 127.0.0.1\nlisten_port = {listen}\nunix_socket_dir =",
            f"auth_type = scram-sha-256\nauth_file = {work / 'users.txt'}",
            "pool_mode = session\nmax_client_conn = 200\ndefault_pool_size = 64",
            f"logfile = {work / 'log'}\npidfile = {work / 'pid'}",
        ]
        if tls is not None:
            cert, key = (work / "cert.pem", work / "key.pem")
            shutil.copy(tls[0], cert)
            shutil.copy(tls[1], key)
            lines += [f"client_tls_sslmode = allow\nclient_tls_cert_file = {cert}"]
            lines += [f"client_tls_key_file = {key}"]
        (work / "pgbouncer.ini").write_text("\n".join(lines) + "\n")
        uid = pwd.getpwnam(owner).pw_uid
        for entry in (work, *work.iterdir()):
            os.chown(entry, uid, -1)
        subprocess.run([exe, "-d", "-u", owner, str(work / "pgbouncer.ini")], check=True)
        deadline = time.monotonic() + 10
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", listen)):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"pgbouncer did not listen: {(work / 'log').read_text()}")
            time.sleep(0.05)
        pid = int((work / "pid").read_text())
        try:
            yield listen, pid
        finally:
            os.kill(pid, signal.SIGTERM)
            while Path(f"/proc/{pid}").exists():
                time.sleep(0.05)
