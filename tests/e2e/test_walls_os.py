"""A tenant that is superuser on its own compute stays inside its OS walls (DESIGN §6).

Project A's tenant is made superuser by hand (as a Postgres CVE or a mistake would), then, as
that tenant, through the proxy with A's own URI, runs programs (``COPY ... FROM PROGRAM``) and
reads files (``pg_read_file``) against project B, the store, the logs and the platform's
directories. Every attempt has a control on A's own things that succeeds, so a failure means a
wall, not a missing tool. Only root can switch users: as anyone else pgplane runs every compute
as itself and these walls do not exist (the README says isolation needs root).
"""

from __future__ import annotations

import os
import pwd
import shlex
import shutil
import signal
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from pgplane.compute.local.layout import Layout
from pgplane.compute.local.postgres.pidfile import command_line
from pgplane.compute.local.postgres.records import Records
from pgplane.compute.local.tenants.users import project_user_name
from tests.support import Api, Server, running_server

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="one OS user per project needs root (as anyone else, none exists)"
)


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    with running_server() as srv:
        yield srv


@pytest.fixture(scope="module")
def api(server: Server) -> Iterator[Api]:
    _, key = server.create_key("walls-os@example.com")
    with Api(server, key) as client:
        yield client


HIDDEN = "Permission denied|No such file"  # walled off, or not there at all in the sandbox


class Project:
    """A ready project as the test sees it from outside: ids, URI, paths, its postmaster."""

    def __init__(self, server: Server, body: dict[str, Any]) -> None:
        self.id = body["project"]["id"]
        self.endpoint_id = body["endpoints"][0]["id"]
        self.uri = body["connection_uris"][0]["connection_uri"]
        layout = Layout(server.data_dir.resolve())
        self.dir = layout.project_dir(self.id)
        self.pgdata = layout.pgdata(self.id, body["branch"]["id"])
        self.socket_dir = layout.socket_dir(self.endpoint_id)
        self.log = layout.log_path(self.id, body["branch"]["id"], self.endpoint_id)
        self.user = project_user_name(self.id)
        self.records = layout.postmaster_records

    def postmaster(self) -> tuple[int, int]:
        """(pid, port) of its postmaster as the platform recorded them (the pid file is the
        tenant's, and in its sandbox names the postmaster as pid 2 of its own namespace)."""
        record = Records(self.records).get(self.pgdata)
        assert record is not None
        pid = record.postmaster()
        assert pid is not None
        return pid, record.port

    def query(self, statement: str) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.uri, connect_timeout=30, autocommit=True) as conn:
            cur = conn.execute(statement.encode())
            return cur.fetchall() if cur.description else []


def make_superuser(project: Project) -> None:
    """What a Postgres CVE would do: the tenant's role becomes superuser (done as cloud_admin
    on the compute's own socket, as root, the only one who may reach it)."""
    _, port = project.postmaster()
    with psycopg.connect(
        host=str(project.socket_dir), port=port, user="cloud_admin", dbname="postgres"
    ) as conn:
        conn.execute("ALTER ROLE neondb_owner SUPERUSER")
        conn.commit()


def run_program(project: Project, command: str) -> tuple[int, str]:
    """Run a shell command as the tenant would, on its compute: (exit status, output)."""
    # Backslashes and tabs are COPY's escapes and delimiter: made spaces. The shell sees
    # tr '\\\t' (backslash, tab).
    script = f"out=$({command} 2>&1); rc=$?; "
    script += r"""printf '%s\n' "$out" | tr '\\\t' '  '; """ + 'echo "rc=$rc"'
    copy = sql.SQL("COPY pg_temp.out FROM PROGRAM {}").format(
        sql.Literal(f"sh -c {shlex.quote(script)}")
    )
    with psycopg.connect(project.uri, connect_timeout=30, autocommit=True) as conn:
        conn.execute("CREATE TEMP TABLE out (line text)")
        conn.execute(copy)
        lines = [str(row[0]) for row in conn.execute("SELECT line FROM pg_temp.out").fetchall()]
    rc = int(lines[-1].removeprefix("rc="))
    return rc, "\n".join(lines[:-1])


def refused(project: Project, command: str) -> str:
    rc, out = run_program(project, command)
    assert rc != 0, f"{command!r} succeeded as {project.user}: {out}"
    return out


def allowed(project: Project, command: str) -> str:
    rc, out = run_program(project, command)
    assert rc == 0, f"{command!r} failed as {project.user}: {out}"
    return out


def read_file(project: Project, path: Path) -> bytes:
    with psycopg.connect(project.uri, connect_timeout=30, autocommit=True) as conn:
        row = conn.execute(
            "SELECT pg_catalog.pg_read_binary_file(%s)", [str(path)], prepare=False
        ).fetchone()
    assert row is not None
    return bytes(row[0])


def test_a_superuser_tenant_reaches_nothing_of_another_project_as_root(
    api: Api, server: Server
) -> None:
    a = Project(server, api.create_ready_project(name="walls-a"))
    b = Project(server, api.create_ready_project(name="walls-b"))
    b_pid, b_port = b.postmaster()
    data = server.data_dir.resolve()
    # A's storage settings, written where the storage layer reads them (storage.json).
    retention = {"project": {"history_retention_seconds": 3600}}
    api.settled(a.id, api.http.patch(f"/projects/{a.id}", json=retention))
    make_superuser(a)

    # A's programs run as A's own user: neither root, nor the shared compute user, nor B's.
    uid = int(allowed(a, "id -u"))
    # Nor can they make a user namespace of their own (the sandbox's seccomp filter): inside
    # one they would hold every capability over namespaces, the kernel's code for them open.
    assert "Operation not permitted" in refused(a, "unshare --user --map-root-user id -u")
    assert uid == pwd.getpwnam(a.user).pw_uid != pwd.getpwnam(b.user).pw_uid
    assert uid not in (0, pwd.getpwnam("pgplane").pw_uid)

    # B's data directory and its postmaster.pid: neither by program nor by pg_read_file (not
    # even there, in A's sandbox: only A's branch, socket and Postgres are).
    allowed(a, f"cat {a.pgdata}/PG_VERSION {a.pgdata}/postmaster.pid")
    assert read_file(a, a.pgdata / "PG_VERSION").strip().isdigit()
    for path in (b.pgdata / "PG_VERSION", b.pgdata / "postmaster.pid", b.pgdata / "global"):
        assert "No such file" in refused(a, f"cat {path}") + refused(a, f"ls {path}")
        with pytest.raises(psycopg.Error, match=HIDDEN):
            read_file(a, path)
    refused(a, f"ls {b.dir}")

    # B's socket: not even listed, let alone connected to as cloud_admin.
    a_pid, a_port = a.postmaster()
    # The psql beside the postgres A's compute runs: one its user may execute (the wheel may lie
    # where only root reaches, under /root, and the platform then runs a copy of it).
    a_postgres = command_line(a_pid)
    assert a_postgres is not None
    psql = Path(a_postgres[0]).parent / "psql"
    allowed(a, f"{psql} -h {a.socket_dir} -p {a_port} -U cloud_admin -d postgres -Atc 'select 1'")
    refused(a, f"ls {b.socket_dir}")
    out = refused(
        a, f"{psql} -h {b.socket_dir} -p {b_port} -U cloud_admin -d postgres -c 'select 1'"
    )
    assert "No such file" in out

    # B's processes cannot be signalled, not even probed, nor seen: A's PID namespace holds
    # its own processes alone, its postmaster pid 2 under the sandbox's pid 1.
    allowed(a, "kill -0 2")
    assert "No such process" in refused(a, f"kill -0 {b_pid}")
    seen = allowed(a, "ls /proc | grep -E '^[0-9]+$'").split()
    assert b_pid not in map(int, seen) and len(seen) < 50, seen

    # The store (with the WAL), the logs, the platform's records and keys.
    secrets = [data / "pgplane.db", data / "pgplane.db-wal", b.log, a.log, server.log_path]
    secrets += [a.dir / "storage.json", *(data / "tls").iterdir()]
    for path in secrets:
        assert path.exists(), path
        refused(a, f"cat {path}")
        with pytest.raises(psycopg.Error, match=HIDDEN):
            read_file(a, path)
    for directory in (data, data / "logs", data / "projects", data / "run", data / "spare"):
        refused(a, f"ls {directory}")
    refused(a, f"ls {a.dir / 'endpoints'}")

    # Nothing written into the platform's directories, nor B's.
    allowed(a, f"touch {a.pgdata}/tenant-was-here")
    for directory in (
        data,
        data / "projects",
        data / "logs",
        data / "run",
        data / "templates",
        data / "archive",
        a.dir,
        a.dir / "branches",
        b.pgdata,
    ):
        if directory.exists():
            refused(a, f"touch {directory}/tenant-was-here")
            assert not (directory / "tenant-was-here").exists()

    # A still works, and so does B.
    assert a.query("SELECT 1") == [(1,)]
    assert b.query("SELECT current_user") == [("neondb_owner",)]


def test_modes_and_owners_of_project_and_platform_files_as_root(api: Api, server: Server) -> None:
    a = Project(server, api.create_ready_project(name="modes-a"))
    b = Project(server, api.create_ready_project(name="modes-b"))
    data = server.data_dir.resolve()
    a_user, b_user = pwd.getpwnam(a.user), pwd.getpwnam(b.user)
    assert a_user.pw_uid != b_user.pw_uid
    assert a_user.pw_shell.endswith("nologin")
    assert a_user.pw_dir == "/nonexistent"

    def mode_owner(path: Path) -> tuple[int, int, int]:
        st = path.stat()
        return stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid

    for project, user in ((a, a_user), (b, b_user)):
        assert mode_owner(project.pgdata) == (0o700, user.pw_uid, user.pw_gid)
        assert mode_owner(project.socket_dir) == (0o700, user.pw_uid, user.pw_gid)
        assert mode_owner(project.dir) == (0o710, 0, user.pw_gid)
        # Every file of the data directory is the project's (handed over whole).
        owners = {p.lstat().st_uid for p in project.pgdata.rglob("*")}
        assert owners == {user.pw_uid}
    for name in ("pgplane.db", "pgplane.db-wal", "pgplane.db-shm"):
        assert mode_owner(data / name) == (0o600, 0, 0)
    assert mode_owner(data)[0] == 0o711
    assert mode_owner(data / "logs")[0] == 0o700
    assert mode_owner(data / "spare")[0] == 0o700
    assert mode_owner(a.log)[1] == 0


def test_deleting_a_project_deletes_its_user_as_root(api: Api, server: Server) -> None:
    project = Project(server, api.create_ready_project(name="deleted"))
    pwd.getpwnam(project.user)
    api.settled(project.id, api.http.delete(f"/projects/{project.id}"))
    with pytest.raises(KeyError):
        pwd.getpwnam(project.user)
    assert not project.dir.exists()


def test_a_stopped_postmaster_is_killed_at_once_when_suspended_as_root(
    api: Api, server: Server
) -> None:
    """Issue 33, item 6: a tenant's shell may SIGSTOP its own postmaster (it runs as the
    tenant's user). A stopped process acts on no signal but SIGKILL, so a suspend that sent
    the gentler ones first, after asking it for its roles, its size and a WAL switch, waited
    out each (35 s) holding an operation slot another account's wake needed. It is killed at
    once now, asked nothing, and the compute comes back whole."""
    project = Project(server, api.create_ready_project(name="stopped"))
    project.query("CREATE TABLE kept AS SELECT 1 AS one")
    pid, _ = project.postmaster()
    os.kill(pid, signal.SIGSTOP)  # as its tenant may: the postmaster runs as the tenant's user
    logged = len(server.log())
    api.suspend(project.id, project.endpoint_id)
    said = server.log()[logged:]
    assert "its compute was stopped by its tenant: killed" in said, said
    assert "a process of it is stopped: killed" in said, said
    # Asked nothing first (its roles, its size, a WAL switch: each waited out a timeout), and
    # never signalled gently.
    assert "timeout" not in said and "still running after" not in said, said
    assert project.query("SELECT one FROM kept") == [(1,)]


def test_a_data_directory_of_the_shared_user_is_handed_to_the_project_as_root() -> None:
    # A data directory as an earlier version left it: every compute the shared user's, the
    # project directory open to all. Restarted on it, the platform gives each project's data
    # to the project's user when it next starts a compute there, and the data is all there.
    with running_server() as server:
        _, key = server.create_key("old@example.com")
        with Api(server, key) as api:
            project = Project(server, api.create_ready_project(name="old"))
            project.query("CREATE TABLE kept AS SELECT 42 AS answer")
            # A completed segment archived (linked into the branch's ``wal``) and, with no
            # checkpoint after it, still in pg_wal, where the recovery below reads it.
            _, port = project.postmaster()
            with psycopg.connect(
                host=str(project.socket_dir), port=port, user="cloud_admin", dbname="postgres"
            ) as conn:
                row = conn.execute("SELECT pg_walfile_name(pg_switch_wal())").fetchone()
            assert row is not None
            segment = row[0]
            _wait_for(project.pgdata.with_name("wal") / segment)
        server.stop()
        os.kill(project.postmaster()[0], signal.SIGQUIT)  # as a crash: no checkpoint
        _wait_gone(project.pgdata / "postmaster.pid")
        assert (project.pgdata / "pg_wal" / segment).stat().st_nlink == 2
        shared = pwd.getpwnam("pgplane")
        for path in [project.pgdata, *project.pgdata.rglob("*")]:
            os.chown(path, shared.pw_uid, shared.pw_gid, follow_symlinks=False)
        os.chown(project.dir, 0, 0)
        project.dir.chmod(0o755)
        shutil.rmtree(project.socket_dir, ignore_errors=True)

        server.start()
        assert project.query("SELECT answer FROM kept") == [(42,)]
        user = pwd.getpwnam(project.user)
        assert {p.lstat().st_uid for p in [project.pgdata, *project.pgdata.rglob("*")]} == {
            user.pw_uid
        }
        assert stat.S_IMODE(project.dir.stat().st_mode) == 0o710


def _wait_for(path: Path, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never came"
        time.sleep(0.05)


def _wait_gone(path: Path, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while path.exists():
        assert time.monotonic() < deadline, f"{path} still there"
        time.sleep(0.05)
