"""Who may log in to a compute, and how: the one ``pg_hba.conf`` every postmaster is started with.

Every login from a client goes through the proxy, which authenticates it itself (SCRAM against the
store's verifiers) and then logs in to the compute over its unix socket. That socket's directory
is 0700 and owned by the compute's OS user, so only the platform and that OS user reach it:
there, every role is trusted. TCP, which anything on the machine can reach, keeps SCRAM.

The file is the platform's, not the cluster's: it lives outside every data directory, root-owned
and read-only to compute users, and is named by ``-c hba_file=`` on the postmaster's command line
(which outranks ``postgresql.conf`` and ``ALTER SYSTEM``). So clusters made before this rule, whose
own ``pg_hba.conf`` still says otherwise, follow it too, and no tenant can change it.

Replication (a read-only compute's WAL stream, :mod:`..replicas`) is allowed to the platform's
superuser over the socket alone: the socket directories are the project user's, so only a
project's own replicas (which run as that user, in sandboxes that mount only their branch's
primary's socket) can reach it; TCP has no replication line at all.

Trust over the socket depends on the proxy authenticating every login before it pipes: a proxy
that leaves a role it does not know (one created with SQL) to Postgres would let it in with any
password.
"""

from __future__ import annotations

from pathlib import Path

from pgplane.compute.local.files import write_atomic
from pgplane.compute.local.layout import ensure_dir

PG_HBA = """\
# Written by pgplane. Logins over the unix socket (0700, reached only through the proxy, which
# authenticated the client, or by the platform) are trusted; TCP logins prove a password.
# TYPE  DATABASE  USER  ADDRESS     METHOD
local   all       all               trust
local   replication cloud_admin         trust
host    all       all   0.0.0.0/0   scram-sha-256
host    all       all   ::/0        scram-sha-256
"""


def write_hba(path: Path) -> Path:
    """Make ``path`` hold :data:`PG_HBA`, readable by every compute user, writable by us alone."""
    ensure_dir(path.parent, 0o755)
    try:
        current = path.read_bytes()  # root's: conf/
    except FileNotFoundError:
        current = None
    if current != PG_HBA.encode() or (path.stat().st_mode & 0o777) != 0o644:
        write_atomic(path, PG_HBA.encode(), mode=0o644)
        path.chmod(0o644)  # whatever the umask made of the new file
    return path
