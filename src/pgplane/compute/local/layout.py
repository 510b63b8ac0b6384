"""Where everything lives under the data directory, and the one gate ids pass to become paths.

::

    <data_dir>/
      projects/<project_id>/storage.json             storage settings (history retention)
      projects/<project_id>/endpoints/<endpoint_id>  empty file: endpoints that ever ran here
      projects/<project_id>/branches/<branch_id>/pgdata   the branch's Postgres data directory
      archive/<project_id>/                          cold archive of a detached project
      volumes/<project_id>.img                       as root: the project's filesystem, mounted
                                                     on projects/<project_id>/ (tenants/volumes.py)
      templates/<major>/                             initdb output, copied for every new cluster
      spare/                                         empty files made ahead for copies (spares.py)
      postmasters/                                   the platform's records of its postmasters
      pg/<major>/                                    binaries copied out of reach of root-only dirs
      conf/pg_hba.conf                               who may log in to computes (postgres/hba.py)
      conf/limits/size-limit.conf                    the branch size limit computes enforce
      conf/computes/<project_id>/<branch_id>.conf    a compute's config_file (postgres/limits/)
      extensions/                                    libraries built for computes (postgres/limits/)
      projects/<project_id>/branches/<branch_id>/<endpoint_id>.log   its postmaster's stderr
      projects/<project_id>/branches/<branch_id>/replicas/<endpoint_id>/pgdata   a read-only
                                                     compute's standby copy (replicas/)
      run/wal-<hash>/                                the socket a branch's read-write compute
                                                     also listens on, for its replicas
      run/<endpoint_id>/                             unix socket directory of the postmaster

As root, who may read what (DESIGN §6: a compute's OS user reaches its own project only): the
data directory is 0711 (passed through, never listed); ``pgplane.db`` (with -wal, -shm) 0600,
``logs/``, ``archive/``, ``volumes/`` and ``spare/`` 0700, root's; ``projects/<id>/`` root's
with the project user's group, 0710, so no other project's user gets in; each ``pgdata`` and
socket directory the project user's, 0700; templates the shared compute user's
(``templates/<major>/pgdata`` 0700); ``pg/`` readable by all (binaries). tenants/projects.py and
tenants/users.py say more.

Unix socket paths are limited to 107 bytes, so when ``<data_dir>/run/<id>/.s.PGSQL.<port>`` could
exceed it the socket root moves to ``/tmp/pgplane-<hash of data_dir>/`` (one per data directory,
checked to be ours before use).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

from pgplane.compute.driver import ComputeError

_ID = re.compile(r"[a-z0-9-]{1,60}")

# sockaddr_un.sun_path is 108 bytes with the NUL; Postgres appends "/.s.PGSQL.65535".
_MAX_SOCKET_DIR = 107 - len("/.s.PGSQL.65535")
_MAX_ID = 60

TIMELINE_MARKER = "pgplane.timeline-complete"


def check_id(kind: str, value: str) -> str:
    """Return ``value`` if it is safe as one path component, else raise ComputeError."""
    # fullmatch, not match+$: "$" accepts a trailing newline.
    if not isinstance(value, str) or _ID.fullmatch(value) is None:
        raise ComputeError(f"invalid {kind} {value!r}: expected 1-60 of [a-z0-9-]")
    return value


@dataclass(frozen=True, slots=True)
class Layout:
    data_dir: Path

    @property
    def projects(self) -> Path:
        return self.data_dir / "projects"

    @property
    def templates(self) -> Path:
        return self.data_dir / "templates"

    @property
    def installs(self) -> Path:
        return self.data_dir / "pg"

    @property
    def hba_file(self) -> Path:
        """The pg_hba.conf every postmaster is started with (``-c hba_file``)."""
        return self.data_dir / "conf" / "pg_hba.conf"

    @property
    def size_limit_conf(self) -> Path:
        """Root's, read by every compute: ``pgplane.max_cluster_size`` (postgres/limits/). Its
        directory is what sandboxes mount: a file mounted alone would stay the inode it was,
        and a replaced file would never be seen at a reload."""
        return self.data_dir / "conf" / "limits" / "size-limit.conf"

    def compute_confs(self, project_id: str) -> Path:
        return self.data_dir / "conf" / "computes" / check_id("project id", project_id)

    def compute_conf(self, project_id: str, branch_id: str) -> Path:
        """Root's: the ``config_file`` of the branch's compute (its postgresql.conf, the limit)."""
        return self.compute_confs(project_id) / f"{check_id('branch id', branch_id)}.conf"

    @property
    def extensions(self) -> Path:
        """Root's, 0755: shared libraries pgplane builds for computes to preload."""
        return self.data_dir / "extensions"

    @property
    def logs(self) -> Path:
        return self.data_dir / "logs"

    @property
    def run_root(self) -> Path:
        """Parent of the socket directories: in the data directory when the path is short enough."""
        local = self.data_dir / "run"
        if len(os.fsencode(local)) + 1 + _MAX_ID <= _MAX_SOCKET_DIR:
            return local
        digest = hashlib.sha256(os.fsencode(self.data_dir)).hexdigest()[:12]
        return Path("/tmp") / f"pgplane-{digest}"  # noqa: S108 - checked by ensure_private_dir

    @property
    def postmaster_records(self) -> Path:
        """Root's alone: which postmaster the platform started on which data, where it listens."""
        return self.data_dir / "postmasters"

    @property
    def sandbox_etc(self) -> Path:
        """Root's: the ``/etc/passwd`` and ``/etc/group`` each compute user's sandbox sees."""
        return self.data_dir / "sandbox"

    @property
    def spares(self) -> Path:
        return self.data_dir / "spare"

    @property
    def volumes(self) -> Path:
        """Root's alone: each project's filesystem image (tenants/volumes.py)."""
        return self.data_dir / "volumes"

    @property
    def archives(self) -> Path:
        return self.data_dir / "archive"

    def archive(self, project_id: str) -> Path:
        """The cold archive of a detached project (tenant_detach / tenant_reattach)."""
        return self.archives / check_id("project id", project_id)

    def project_dir(self, project_id: str) -> Path:
        return self.projects / check_id("project id", project_id)

    def storage_config(self, project_id: str) -> Path:
        return self.project_dir(project_id) / "storage.json"

    def endpoint_records(self, project_id: str) -> Path:
        return self.project_dir(project_id) / "endpoints"

    def branch_dir(self, project_id: str, branch_id: str) -> Path:
        return self.project_dir(project_id) / "branches" / check_id("branch id", branch_id)

    def pgdata(self, project_id: str, branch_id: str) -> Path:
        return self.branch_dir(project_id, branch_id) / "pgdata"

    def replicas_dir(self, project_id: str, branch_id: str) -> Path:
        """Root's, 0711: one directory per read-only compute of the branch."""
        return self.branch_dir(project_id, branch_id) / "replicas"

    def replica_pgdata(self, project_id: str, branch_id: str, endpoint_id: str) -> Path:
        """A read-only compute's own data directory: a standby copy of the branch's."""
        endpoint = check_id("endpoint id", endpoint_id)
        return self.replicas_dir(project_id, branch_id) / endpoint / "pgdata"

    def socket_dir(self, endpoint_id: str) -> Path:
        return self.run_root / check_id("endpoint id", endpoint_id)

    def wal_socket_dir(self, project_id: str, branch_id: str) -> Path:
        """Where the branch's read-write compute also puts its socket, for its replicas' WAL
        streams: one directory for the branch's life (not the endpoint's, whose socket
        directory is a new filesystem at each start), so a replica started before the primary
        restarted still reaches it. Only the branch's own sandboxes mount it."""
        key = f"{check_id('project id', project_id)}/{check_id('branch id', branch_id)}"
        return self.run_root / f"wal-{hashlib.sha256(key.encode()).hexdigest()[:16]}"

    def init_socket_dir(self, project_id: str, branch_id: str) -> Path:
        """Socket directory of the temporary postmaster that creates a timeline's roles."""
        key = f"{check_id('project id', project_id)}/{check_id('branch id', branch_id)}"
        return self.run_root / f"init-{hashlib.sha256(key.encode()).hexdigest()[:16]}"

    def log_path(self, project_id: str, branch_id: str, endpoint_id: str) -> Path:
        """The endpoint's postmaster's stderr: root's, in its branch's directory, so what its
        tenant writes there counts against the project's disk share (tenants/volumes.py)."""
        return (
            self.branch_dir(project_id, branch_id) / f"{check_id('endpoint id', endpoint_id)}.log"
        )

    def old_log_path(self, endpoint_id: str) -> Path:
        """Where an earlier version kept the endpoint's log (removed with its project)."""
        return self.logs / f"{check_id('endpoint id', endpoint_id)}.log"

    def template(self, major: int) -> Path:
        return self.templates / str(major)

    def install_copy(self, major: int) -> Path:
        return self.installs / str(major)


def ensure_dir(path: Path, mode: int = 0o711) -> Path:
    """Create ``path`` (and parents) if missing and set its mode, whatever the umask."""
    path.mkdir(parents=True, exist_ok=True)
    if stat.S_IMODE(path.stat().st_mode) != mode:
        path.chmod(mode)
    return path


def ensure_private_dir(path: Path, mode: int = 0o711) -> Path:
    """Like ensure_dir, for a directory in a shared place such as /tmp: refuse one we do not own."""
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=mode)
    st = path.lstat()
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        raise ComputeError(f"{path} exists and is not a directory owned by us; remove it")
    if stat.S_IMODE(st.st_mode) != mode:
        path.chmod(mode)
    return path
