"""History: branches at a point in time or LSN, restores and resets, retention, over HTTP and
the Postgres protocol against a real server (its history keeper every second)."""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from tests.support import Api, Server, postmaster_pid, running_server, wait_for


@pytest.fixture(scope="module")
def history_server() -> Iterator[Server]:
    with running_server(
        PGPLANE_HISTORY_SECONDS="1", PGPLANE_HISTORY_BASE_BYTES=str(48 << 20)
    ) as srv:
        yield srv


@pytest.fixture
def hapi(history_server: Server) -> Iterator[Api]:
    _, key = history_server.create_key(f"history-{time.monotonic_ns()}")
    with Api(history_server, key) as client:
        yield client


def _rows(uri: str) -> list[int]:
    with psycopg.connect(uri, connect_timeout=10) as conn:
        return [r[0] for r in conn.execute("SELECT v FROM t ORDER BY v").fetchall()]


def _commit(uri: str, value: int) -> tuple[str, str]:
    """Insert ``value`` in a transaction of its own; Postgres' clock and LSN once committed (a
    point after this commit and before the next one)."""
    with psycopg.connect(uri, autocommit=True) as conn:
        conn.execute("INSERT INTO t VALUES (%s)", (value,))
        lsn = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
        now = conn.execute("SELECT clock_timestamp()").fetchone()
    assert lsn is not None and now is not None
    moment: datetime.datetime = now[0]
    return moment.astimezone(datetime.UTC).isoformat().replace("+00:00", "Z"), lsn[0]


def _project_with_table(api: Api, name: str) -> tuple[dict[str, Any], str, str]:
    project = api.create_ready_project(name=name)
    pid = project["project"]["id"]
    uri = project["connection_uris"][0]["connection_uri"]
    with psycopg.connect(uri, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (v int)")
    return project, pid, uri


def _branch(api: Api, pid: str, **branch: object) -> dict[str, Any]:
    r = api.http.post(
        f"/projects/{pid}/branches", json={"branch": branch, "endpoints": [{"type": "read_write"}]}
    )
    return api.settled(pid, r)


def test_branches_at_a_time_and_an_lsn_hold_exactly_what_was_committed_by_then(
    hapi: Api,
) -> None:
    project, pid, uri = _project_with_table(hapi, "pitr")
    main = project["branch"]["id"]
    _commit(uri, 1)
    t1, lsn1 = _commit(uri, 2)
    time.sleep(0.05)
    _commit(uri, 3)
    t2, lsn2 = _commit(uri, 4)
    time.sleep(0.05)
    _commit(uri, 5)

    at_time = _branch(hapi, pid, name="at-t1", parent_id=main, parent_timestamp=t1)
    assert _rows(at_time["connection_uris"][0]["connection_uri"]) == [1, 2]
    at_lsn = _branch(hapi, pid, name="at-lsn2", parent_id=main, parent_lsn=lsn2)
    assert _rows(at_lsn["connection_uris"][0]["connection_uri"]) == [1, 2, 3, 4]
    shown = hapi.http.get(f"/projects/{pid}/branches/{at_lsn['branch']['id']}").json()["branch"]
    assert shown["parent_lsn"] is not None
    assert _rows(uri) == [1, 2, 3, 4, 5]  # the parent, untouched

    # The same on a suspended parent.
    endpoint_id = project["endpoints"][0]["id"]
    hapi.suspend(pid, endpoint_id)
    again = _branch(hapi, pid, name="at-t2", parent_id=main, parent_timestamp=t2)
    assert _rows(again["connection_uris"][0]["connection_uri"]) == [1, 2, 3, 4]
    at_lsn1 = _branch(hapi, pid, name="at-lsn1", parent_id=main, parent_lsn=lsn1)
    assert _rows(at_lsn1["connection_uris"][0]["connection_uri"]) == [1, 2]


def _history_bytes(server: Server, pid: str, branch_id: str) -> int:
    """Bytes of the branch's archive and base states (files the keeper removes meanwhile, such
    as a base state being taken, are skipped)."""
    top = server.data_dir / "projects" / pid / "branches" / branch_id
    total = 0
    for sub in ("wal", "base"):
        for root, _, names in os.walk(top / sub):
            for name in names:
                with contextlib.suppress(FileNotFoundError):
                    total += os.lstat(os.path.join(root, name)).st_size
    return total


def test_shrinking_the_retention_frees_old_history(hapi: Api, history_server: Server) -> None:
    project, pid, uri = _project_with_table(hapi, "retention")
    main = project["branch"]["id"]
    with psycopg.connect(uri, autocommit=True) as conn:
        for _ in range(4):  # ~5 segments of WAL: past the keeper's 48 MB, a new base state
            conn.execute("INSERT INTO t SELECT generate_series(1, 400000)")
    bases = history_server.data_dir / "projects" / pid / "branches" / main / "base"
    wait_for(
        "a second base state",
        lambda: len([p for p in bases.iterdir() if (p / "base.json").is_file()]) >= 2,
        timeout=120,
        server=history_server,
    )
    before = _history_bytes(history_server, pid, main)
    r = hapi.http.patch(f"/projects/{pid}", json={"project": {"history_retention_seconds": 1}})
    hapi.settled(pid, r)
    after = wait_for(
        "old history freed",
        lambda: (b := _history_bytes(history_server, pid, main)) < before and b,
        timeout=60,
        server=history_server,
    )
    assert after < before


def test_a_new_projects_history_starts_at_the_template_it_was_copied_from(
    hapi: Api, history_server: Server
) -> None:
    """Its first base state is the template, byte for byte, before its roles and database were
    made (their WAL follows it): on a project's own filesystem too, where the template cannot
    be linked and is copied once, the branch's data cloned from that copy."""
    project = hapi.create_ready_project(name="first-base")
    pid, main = project["project"]["id"], project["branch"]["id"]
    template = history_server.data_dir / "templates" / str(project["project"]["pg_version"])
    bases = history_server.data_dir / "projects" / pid / "branches" / main / "base"
    first = min(p for p in bases.iterdir() if (p / "base.json").is_file())
    files = json.loads((first / "base.json").read_text())["files"]
    on_disk = {
        str(path.relative_to(template / "pgdata")): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in (template / "pgdata").rglob("*")
        if path.is_file()
    }
    assert files == on_disk
    for rel, digest in files.items():
        assert hashlib.sha256((first / "pgdata" / rel).read_bytes()).hexdigest() == digest, rel


def _restore(api: Api, pid: str, branch_id: str, **body: object) -> dict[str, Any]:
    r = api.http.post(f"/projects/{pid}/branches/{branch_id}/restore", json=body)
    return api.settled(pid, r)


def _branch_of(api: Api, pid: str, branch_id: str) -> dict[str, Any]:
    r = api.http.get(f"/projects/{pid}/branches/{branch_id}")
    assert r.status_code == 200, r.text
    return dict(r.json()["branch"])


def test_a_branch_restored_to_its_own_past_keeps_both_states_and_its_connection_string(
    hapi: Api,
) -> None:
    project, pid, uri = _project_with_table(hapi, "undo")
    main = project["branch"]["id"]
    _commit(uri, 1)
    before_migration, _ = _commit(uri, 2)
    time.sleep(0.05)
    with psycopg.connect(uri, autocommit=True) as conn:  # the bad migration, and a session
        conn.execute("DELETE FROM t")
        conn.execute("INSERT INTO t VALUES (99)")
    held = psycopg.connect(uri, autocommit=True)
    try:
        body = _restore(
            hapi,
            pid,
            main,
            source_branch_id=main,
            source_timestamp=before_migration,
            preserve_under_name="main_old",
        )
        assert [o["action"] for o in body["operations"]] == ["create_timeline", "create_branch"]
        # Its connection ended when the compute came back on the restored data.
        with pytest.raises(psycopg.OperationalError):
            held.execute("SELECT 1")
    finally:
        held.close()
    assert _rows(uri) == [1, 2]  # the same connection string, the restored data
    restored = _branch_of(hapi, pid, main)
    assert restored["current_state"] == "ready"
    assert restored["last_reset_at"] is not None
    kept = _branch_of(hapi, pid, restored["parent_id"])
    assert kept["name"] == "main_old"
    assert kept["current_state"] == "ready"
    # The state before the restore, on a compute of its own.
    r = hapi.http.post(
        f"/projects/{pid}/endpoints",
        json={"endpoint": {"branch_id": kept["id"], "type": "read_write"}},
    )
    endpoint = hapi.settled(pid, r)["endpoint"]
    r = hapi.http.get(
        f"/projects/{pid}/connection_uri",
        params={
            "branch_id": kept["id"],
            "endpoint_id": endpoint["id"],
            "database_name": "neondb",
            "role_name": "neondb_owner",
        },
    )
    assert _rows(r.json()["uri"]) == [99]


def test_a_child_reset_to_its_parent_keeps_its_connection_string(hapi: Api) -> None:
    project, pid, uri = _project_with_table(hapi, "reset")
    main = project["branch"]["id"]
    _commit(uri, 1)
    child = _branch(hapi, pid, name="preview", parent_id=main)
    child_id = child["branch"]["id"]
    child_uri = child["connection_uris"][0]["connection_uri"]
    _commit(child_uri, 100)
    _commit(uri, 2)
    body = _restore(hapi, pid, child_id, source_branch_id=main)
    assert body["branch"]["id"] == child_id
    assert _rows(child_uri) == [1, 2]
    shown = _branch_of(hapi, pid, child_id)
    assert shown["parent_id"] == main
    assert shown["parent_lsn"] is not None
    assert len(hapi.http.get(f"/projects/{pid}/branches").json()["branches"]) == 2


def _refused(r: Any, *words: str) -> None:
    assert r.status_code == 400, r.text
    message = r.json()["message"]
    for word in words:
        assert word in message, message


def test_points_outside_the_history_are_refused_and_create_nothing(hapi: Api) -> None:
    project, pid, uri = _project_with_table(hapi, "refusals")
    main = project["branch"]["id"]
    _commit(uri, 1)
    created = datetime.datetime.fromisoformat(
        project["branch"]["created_at"].replace("Z", "+00:00")
    )

    def branch(**point: object) -> Any:
        return hapi.http.post(f"/projects/{pid}/branches", json={"branch": point})

    future = (datetime.datetime.now(datetime.UTC) + datetime.timedelta(hours=1)).isoformat()
    _refused(branch(parent_timestamp=future), "in the future")
    before = (created - datetime.timedelta(minutes=5)).isoformat()
    _refused(branch(parent_timestamp=before), "before branch", "existed")
    _refused(branch(parent_lsn="FF/0"), "never had")
    _refused(branch(parent_lsn="0/0"), "no LSN")
    _refused(branch(parent_lsn="0/1", parent_timestamp=future), "not both")
    _refused(branch(parent_timestamp="yesterday"), "RFC 3339")
    _refused(branch(parent_timestamp="2026-01-01T00:00:00"), "time zone")
    r = branch(parent_lsn="nonsense")
    assert r.status_code == 400, r.text
    # A branch restored from its own past must name a point and keep its state.
    r = hapi.http.post(f"/projects/{pid}/branches/{main}/restore", json={"source_branch_id": main})
    _refused(r, "source_lsn or source_timestamp")
    r = hapi.http.post(
        f"/projects/{pid}/branches/{main}/restore",
        json={"source_branch_id": main, "source_timestamp": future, "preserve_under_name": "x"},
    )
    _refused(r, "in the future")
    r = hapi.http.post(
        f"/projects/{pid}/branches/{main}/restore",
        json={"source_branch_id": main, "source_lsn": "0/1"},
    )
    _refused(r, "preserve_under_name")
    # Outside a window of 1 second (the project's, shrunk).
    r = hapi.http.patch(f"/projects/{pid}", json={"project": {"history_retention_seconds": 1}})
    hapi.settled(pid, r)
    time.sleep(1.5)
    past = (datetime.datetime.now(datetime.UTC) - datetime.timedelta(seconds=1.2)).isoformat()
    _refused(branch(parent_timestamp=past), "outside the project's history window of 1 seconds")
    r = hapi.http.patch(f"/projects/{pid}", json={"project": {"history_retention_seconds": 0}})
    hapi.settled(pid, r)
    now = datetime.datetime.now(datetime.UTC).isoformat()
    _refused(branch(parent_timestamp=now), "keeps no history")
    branches = hapi.http.get(f"/projects/{pid}/branches").json()["branches"]
    assert [b["id"] for b in branches] == [main]
    ops = hapi.operations(pid)
    assert {o["action"] for o in ops} <= {
        "create_timeline",
        "start_compute",
        "apply_storage_config",
    }


def test_history_goes_with_a_detached_project_and_comes_back() -> None:
    """A point before the detach, asked after it: the project is reattached (its archive and
    base states unpacked with it) and the branch holds exactly what was committed by then."""
    with running_server(
        PGPLANE_DETACH_AFTER_SECONDS="2",
        PGPLANE_SCHEDULER_SECONDS="0.2",
        PGPLANE_HISTORY_SECONDS="1",
    ) as server:
        _, key = server.create_key("cold-history@example.com")
        with Api(server, key) as api:
            project, pid, uri = _project_with_table(api, "cold-history")
            main = project["branch"]["id"]
            _commit(uri, 1)
            moment, _ = _commit(uri, 2)
            time.sleep(0.05)
            _commit(uri, 3)
            api.suspend(pid, project["endpoints"][0]["id"])
            wait_for(
                "tenant_detach",
                lambda: any(
                    o["action"] == "tenant_detach" and o["status"] == "finished"
                    for o in api.operations(pid)
                ),
                server=server,
            )
            assert not (server.data_dir / "projects" / pid).exists()

            # Detached, its history's bounds are not known when asked: an LSN it never had is
            # accepted, and its branch fails at once (no retry can help), saying why.
            r = api.http.post(
                f"/projects/{pid}/branches",
                json={"branch": {"name": "never", "parent_id": main, "parent_lsn": "FF/0"}},
            )
            assert r.status_code == 201, r.text
            op = next(o for o in r.json()["operations"] if o["action"] == "create_branch")
            (failed,) = api.wait_operations(pid, [op["id"]])
            assert failed["status"] == "failed", failed
            assert failed["failures_count"] == 1, failed
            assert "past the end of the branch's history" in failed["error"], failed

            then = _branch(api, pid, name="before-detach", parent_id=main, parent_timestamp=moment)
            assert _rows(then["connection_uris"][0]["connection_uri"]) == [1, 2]
            actions = [o["action"] for o in api.operations(pid)]
            assert "tenant_reattach" in actions, actions
            assert _rows(uri) == [1, 2, 3]


def test_a_branch_at_now_of_a_parent_whose_compute_died_holds_every_commit(
    hapi: Api, history_server: Server
) -> None:
    """A parent killed mid-flight left no abort marker at the end of its WAL: a time after its
    last commit is never "reached" by the replay, which then goes on to the end of the history
    (every commit, none lost)."""
    project, pid, uri = _project_with_table(hapi, "died")
    main = project["branch"]["id"]
    _commit(uri, 1)
    _commit(uri, 2)
    pgdata = history_server.data_dir / "projects" / pid / "branches" / main / "pgdata"
    postmaster = postmaster_pid(history_server.data_dir, pgdata)
    assert postmaster is not None
    os.kill(postmaster, signal.SIGKILL)
    wait_for("the parent's postmaster gone", lambda: not _alive(postmaster))
    now = datetime.datetime.now(datetime.UTC).isoformat()
    then = _branch(hapi, pid, name="now", parent_id=main, parent_timestamp=now)
    assert _rows(then["connection_uris"][0]["connection_uri"]) == [1, 2]
    assert "after the last commit archived: replaying all of it" in history_server.log()
    assert _rows(uri) == [1, 2]  # the parent, started again by the connection


def _alive(pid: int) -> bool:
    """Running (a zombie its parent, serve, has not reaped yet is not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def _flip_a_byte(path: Path) -> None:
    with path.open("r+b") as f:
        f.seek(path.stat().st_size // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0xFF]))


def test_a_damaged_history_fails_the_branch_and_says_why() -> None:
    """A byte changed in a base state, then in the archived segment holding the point: the
    branch at that point fails with the damage named, and nothing of its replay is published.
    (The archive shares its segments' blocks with pg_wal: the damage is done once the parent
    no longer needs the segment, its compute suspended.)"""
    with running_server(PGPLANE_HISTORY_SECONDS="1", PGPLANE_MAX_ATTEMPTS="1") as server:
        _, key = server.create_key("damage@example.com")
        with Api(server, key) as api:
            project, pid, uri = _project_with_table(api, "damage")
            main = project["branch"]["id"]
            _commit(uri, 1)
            moment, _ = _commit(uri, 2)
            time.sleep(0.05)
            _commit(uri, 3)
            with psycopg.connect(uri) as conn:
                row = conn.execute("SELECT pg_walfile_name(pg_current_wal_lsn())").fetchone()
            assert row is not None
            segment = row[0]
            branch_dir = server.data_dir / "projects" / pid / "branches" / main

            def fails_with(words: str) -> None:
                r = api.http.post(
                    f"/projects/{pid}/branches",
                    json={"branch": {"parent_id": main, "parent_timestamp": moment}},
                )
                assert r.status_code == 201, r.text
                op = next(o for o in r.json()["operations"] if o["action"] == "create_branch")
                (done,) = api.wait_operations(pid, [op["id"]])
                assert done["status"] == "failed", done
                assert words in done["error"], done["error"]

            bases = sorted(p for p in (branch_dir / "base").iterdir() if p.name[0] != ".")
            base = next(p for p in bases if (p / "base.json").is_file())
            files = [p for p in (base / "pgdata" / "base").rglob("*") if p.is_file()]
            biggest = max(files, key=lambda p: p.stat().st_size)
            original = biggest.read_bytes()
            _flip_a_byte(biggest)
            fails_with("does not match its checksum")
            biggest.write_bytes(original)

            # The segment holding the point, archived by the suspend and catalogued by the
            # keeper (its checksum taken as first seen), then damaged.
            api.suspend(pid, project["endpoints"][0]["id"])
            sums = branch_dir / "base" / "wal.json"
            wait_for(
                "the point's segment catalogued",
                lambda: sums.is_file() and segment in json.loads(sums.read_bytes()),
                server=server,
            )
            _flip_a_byte(branch_dir / "wal" / segment)
            fails_with(f"archived WAL segment {segment} does not match its checksum")


def _sql_over_http(server: Server, uri: str, query: str) -> list[list[str]]:
    """``query``'s rows through the proxy's ``POST /sql``, as the serverless driver sends it
    (its connections pooled by the proxy between requests)."""
    r = httpx.post(
        f"http://127.0.0.1:{server.proxy_port}/sql",
        headers={"Neon-Connection-String": uri, "Neon-Array-Mode": "true"},
        json={"query": query},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    return [[str(v) for v in row] for row in r.json()["rows"]]


def test_no_new_connection_reads_the_data_a_reset_or_restore_replaced(
    hapi: Api, history_server: Server
) -> None:
    """Once the API has answered a reset or a restore, no new connection to the branch reads
    the data it replaces, over TCP or SQL over HTTP (whose pooled connection to the old compute
    is waiting): each waits for the compute with the new data. Twenty times, resets from the
    parent and restores from another branch in turn, each read at once."""
    project, pid, uri = _project_with_table(hapi, "consistent")
    main = project["branch"]["id"]
    _commit(uri, 1)
    fixture = _branch(hapi, pid, name="fixture")
    _commit(fixture["connection_uris"][0]["connection_uri"], 2)
    ci = _branch(hapi, pid, name="ci")
    ci_id, ci_uri = ci["branch"]["id"], ci["connection_uris"][0]["connection_uri"]
    sources = {main: [1], fixture["branch"]["id"]: [1, 2]}
    order = "SELECT v FROM t ORDER BY v"
    for i in range(20):
        source = list(sources)[i % 2]
        with psycopg.connect(ci_uri, autocommit=True) as conn:
            conn.execute("INSERT INTO t VALUES (%s)", (100 + i,))  # what the restore replaces
        assert [int(v) for [v] in _sql_over_http(history_server, ci_uri, "SELECT v FROM t")]
        r = hapi.http.post(
            f"/projects/{pid}/branches/{ci_id}/restore", json={"source_branch_id": source}
        )
        assert r.status_code == 200, r.text
        reads = [
            lambda: _rows(ci_uri),
            lambda: [int(v) for [v] in _sql_over_http(history_server, ci_uri, order)],
        ]
        for read in reads if i // 2 % 2 else reversed(reads):  # either door the first
            assert read() == sources[source], (i, source)
        ops = hapi.wait_operations(pid, [o["id"] for o in r.json()["operations"]])
        assert {o["status"] for o in ops} == {"finished"}, ops
