"""Root never trusts, follows or blocks on a file a tenant can write (issue 20, findings 1-4).

Project A's tenant holds its compute's OS user (a shell from ``COPY ... FROM PROGRAM``, as
Postgres 15 hands any tenant and a CVE hands out on any version; here the role is made
superuser by hand, as in test_walls_os.py). From that shell it forges what the platform used to
read: a ``postmaster.pid`` naming project B's socket and port, its own socket made a link to
B's, a FIFO as ``PG_VERSION`` and as an archived WAL segment. Then it asks the platform, through
the API and the proxy, to act on its own things. B's data, roles and socket are untouched, the
platform acts on A alone or refuses, and ``/livez`` and B's API and queries answer meanwhile.
"""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import httpx
import psycopg
import pytest

from pgplane.compute.local.layout import Layout
from tests.e2e.test_walls_os import Project, allowed, make_superuser, refused
from tests.support import Api, Server, running_server, wait_for

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="one OS user per project needs root (as anyone else, none exists)"
)

SLOW = 5.0  # seconds: an answer slower than this while a tenant attacks counts as frozen


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    # The keeper runs every second, so it meets the tenant's FIFOs at once.
    with running_server(PGPLANE_HISTORY_SECONDS="1") as srv:
        yield srv


@pytest.fixture(scope="module")
def api(server: Server) -> Iterator[Api]:
    _, key = server.create_key("walls-files@example.com")
    with Api(server, key) as client:
        yield client


@pytest.fixture(scope="module")
def victim(server: Server) -> Iterator[tuple[Api, Project]]:
    """Project B, another account's, with a table and a role the tenant must never touch."""
    _, key = server.create_key("walls-files-victim@example.com")
    with Api(server, key) as client:
        b = Project(server, client.create_ready_project(name="victim"))
        b.query("CREATE TABLE b_secret (v text); INSERT INTO b_secret VALUES ('b only')")
        yield client, b


def as_os_user(project: Project, command: str) -> None:
    """Run a shell command as the project's OS user, on the host, outside any sandbox."""
    user = pwd.getpwnam(project.user)
    argv = ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--clear-groups"]
    subprocess.run([*argv, "sh", "-c", command], check=True, cwd="/", timeout=30)


def _branch_without_compute(api: Api, project_id: str, name: str) -> dict[str, Any]:
    body = api.settled(
        project_id,
        api.http.post(f"/projects/{project_id}/branches", json={"branch": {"name": name}}),
    )
    return dict(body["branch"])


def _answers_quickly(server: Server, api: Api, b: Project) -> None:
    """/livez, another account's API call and query answer in their usual time."""
    started = time.monotonic()
    assert httpx.get(f"http://127.0.0.1:{server.port}/livez", timeout=SLOW).status_code == 200
    assert api.http.get(f"/projects/{b.id}").status_code == 200
    assert b.query("SELECT v FROM b_secret") == [("b only",)]
    assert time.monotonic() - started < SLOW


def _keeps_answering(server: Server, api: Api, b: Project, *, seconds: float) -> None:
    deadline = time.monotonic() + seconds  # several rounds of the keeper
    while time.monotonic() < deadline:
        _answers_quickly(server, api, b)
        time.sleep(0.5)


def _b_roles(b: Project) -> set[str]:
    rows = b.query("SELECT rolname FROM pg_catalog.pg_roles WHERE rolname !~ '^pg_'")
    return {str(r[0]) for r in rows}


def test_a_forged_pid_file_never_points_the_platform_at_another_account(
    api: Api, server: Server, victim: tuple[Api, Project]
) -> None:
    b_api, b = victim
    a = Project(server, api.create_ready_project(name="forger"))
    make_superuser(a)
    branch = _branch_without_compute(api, a.id, "no-compute")
    pgdata = Layout(server.data_dir.resolve()).pgdata(a.id, branch["id"])
    b_roles = _b_roles(b)
    _, b_port = b.postmaster()

    # From its compute's sandbox the tenant sees only the branch that compute serves.
    assert "No such file" in refused(a, f"ls {pgdata}")
    # As its OS user outside it (a tenant who got past the sandbox too): a live process named
    # postgres working in the branch's data directory, and a pid file naming it with B's port
    # and socket directory (both once seen by any tenant in ps).
    fake = f"/tmp/pgplane-fake-{a.id}"
    as_os_user(a, f"mkdir -p {fake} && cp /bin/sleep {fake}/postgres")
    as_os_user(a, f"cd {pgdata} && (setsid {fake}/postgres 600 >/dev/null 2>&1 &)")
    found = subprocess.run(
        ["pgrep", "-f", f"{fake}/postgres 600"], capture_output=True, text=True, check=True
    )
    fake_pid = found.stdout.split()[0]
    fields = [fake_pid, str(pgdata), "1700000000", str(b_port), str(b.socket_dir), "*", "1 1"]
    text = "\\n".join([*fields, "ready"])
    as_os_user(a, f"printf '{text}\\n' > {pgdata}/postmaster.pid")

    # The API then acts on A's branch: a role added (apply_config), a database made and
    # dropped; branch copies of it; finally the branch deleted.
    roles = f"/projects/{a.id}/branches/{branch['id']}/roles"
    api.settled(a.id, api.http.post(roles, json={"role": {"name": "forged_role"}}))
    dbs = f"/projects/{a.id}/branches/{branch['id']}/databases"
    api.settled(
        a.id,
        api.http.post(dbs, json={"database": {"name": "neondb2", "owner_name": "forged_role"}}),
    )
    api.settled(a.id, api.http.delete(f"{dbs}/neondb2"))
    child = api.settled(
        a.id,
        api.http.post(
            f"/projects/{a.id}/branches",
            json={"branch": {"name": "child", "parent_id": branch["id"]}},
        ),
    )
    _answers_quickly(server, b_api, b)
    assert _b_roles(b) == b_roles  # no forged_role there, nothing else changed
    assert b.query("SELECT v FROM b_secret") == [("b only",)]  # B's own password still works
    for doomed in (child["branch"]["id"], branch["id"]):
        api.settled(a.id, api.http.delete(f"/projects/{a.id}/branches/{doomed}"))
    assert b.socket_dir.is_dir()  # not removed as "the branch's socket directory"
    assert b.query("SELECT 1") == [(1,)]


def test_a_socket_made_a_link_to_another_accounts_reaches_nothing(
    api: Api, server: Server, victim: tuple[Api, Project]
) -> None:
    b_api, b = victim
    a_body = api.create_ready_project(name="linker")
    a = Project(server, a_body)
    make_superuser(a)
    _, a_port = a.postmaster()
    _, b_port = b.postmaster()
    socket = a.socket_dir / f".s.PGSQL.{a_port}"
    # Swapped by a process that outlives the COPY: the link stands once the session ends.
    swap = f"sleep 1; rm -f {socket}; ln -s {b.socket_dir}/.s.PGSQL.{b_port} {socket}"
    allowed(a, f"true && (setsid sh -c '{swap}' >/dev/null 2>&1 &)")
    deadline = time.monotonic() + 30
    while not socket.is_symlink():
        assert time.monotonic() < deadline, "the tenant's link never appeared"
        time.sleep(0.1)
    # The platform's own sessions (a role added on A) do not run on B. First, while nothing
    # else is queued for A (a wake the proxy's query below asks for would be). The attempt
    # finds a link where the postmaster's socket was and fails the operation at once, saying
    # why: no retry can succeed while that postmaster runs (five retries held the wake below,
    # and its client, for 30 s).
    b_roles = _b_roles(b)
    response = api.http.post(
        f"/projects/{a.id}/branches/{a_body['branch']['id']}/roles",
        json={"role": {"name": "linked_role"}},
    )
    assert response.status_code == 201, response.text
    [apply] = [o["id"] for o in response.json()["operations"] if o["action"] == "apply_config"]
    [failed] = api.wait_operations(a.id, [apply], timeout=30)
    assert failed["status"] == "failed" and failed["failures_count"] == 1, failed
    assert "not a socket: replaced" in failed["error"], failed
    assert _b_roles(b) == b_roles
    # Through the proxy with A's own URI: never a session on B's compute, and told at once.
    started = time.monotonic()
    try:
        rows = a.query("SELECT count(*) FROM pg_catalog.pg_tables WHERE tablename = 'b_secret'")
    except psycopg.Error:
        rows = None
    assert rows in (None, [(0,)])
    assert time.monotonic() - started < 15
    _answers_quickly(server, b_api, b)
    assert _b_roles(b) == b_roles
    # A suspend's stop removes what stands where the socket was; the next start makes it anew.
    api.suspend(a.id, a_body["endpoints"][0]["id"])
    assert a.query("SELECT count(*) FROM pg_catalog.pg_tables WHERE tablename = 'b_secret'") == [
        (0,)
    ]
    assert not socket.is_symlink()
    api.http.delete(f"/projects/{a.id}")


def test_a_fifo_or_a_link_as_pg_version_freezes_nothing(
    api: Api, server: Server, victim: tuple[Api, Project]
) -> None:
    """The keeper reads each branch's PG_VERSION every second: opened without O_NONBLOCK, a
    FIFO there held the event loop (the API, the proxy, /livez) until a writer came."""
    b_api, b = victim
    a = Project(server, api.create_ready_project(name="fifo-version"))
    make_superuser(a)
    pg_version = f"{a.pgdata}/PG_VERSION"
    allowed(a, f"mv {pg_version} {pg_version}.real && mkfifo {pg_version}")
    _keeps_answering(server, b_api, b, seconds=4)
    # A link to another account's file leads nowhere either.
    allowed(a, f"rm {pg_version} && ln -s {b.pgdata}/PG_VERSION {pg_version}")
    _keeps_answering(server, b_api, b, seconds=2)
    api.http.delete(f"/projects/{a.id}")


def test_a_fifo_in_the_archive_stalls_no_other_history(
    api: Api, server: Server, victim: tuple[Api, Project]
) -> None:
    """The keeper hashes each archived segment: opened plainly, a FIFO among A's held the
    keeper (and a thread) for good, and no other account's history was kept any more."""
    b_api, b = victim
    a = Project(server, api.create_ready_project(name="fifo-wal"))
    make_superuser(a)
    allowed(a, f"mkfifo {a.pgdata.parent}/wal/000000010000000000000099")
    server.wait_for_log("archived WAL 000000010000000000000099 of")  # the keeper has met it
    _answers_quickly(server, b_api, b)
    ((segment,),) = b.query("SELECT pg_catalog.pg_walfile_name(pg_catalog.pg_current_wal_lsn())")
    b_api.suspend(b.id, b.endpoint_id)  # archives B's current segment
    sums = b.pgdata.parent / "base" / "wal.json"
    wait_for(
        "B's newest segment catalogued",
        lambda: sums.is_file() and segment in json.loads(sums.read_bytes()),
        timeout=30,
        server=server,
    )
    api.http.delete(f"/projects/{a.id}")
