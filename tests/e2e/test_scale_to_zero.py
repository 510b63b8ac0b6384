"""Scale to zero through the real proxy: wake on connect, idle suspend, detach and reattach.

Every test talks to ``pgplane serve`` over HTTP and to Postgres through the proxy, with psql and
psycopg, as a user of the platform would.
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import errors

from pgplane.compute.local.cold.archive import tree_checksums
from tests import pgclient
from tests.stores import store_sql
from tests.support import Api, Server, pg_binary, plaintext, running_server, wait_for


def _ops(api: Api, pid: str) -> list[dict[str, Any]]:
    r = api.http.get(f"/projects/{pid}/operations", params={"limit": 1000})
    assert r.status_code == 200, r.text
    return list(r.json()["operations"])


def _endpoint(api: Api, pid: str, eid: str) -> dict[str, Any]:
    r = api.http.get(f"/projects/{pid}/endpoints/{eid}")
    assert r.status_code == 200, r.text
    return dict(r.json()["endpoint"])


def _suspend(api: Api, pid: str, eid: str) -> None:
    r = api.http.post(f"/projects/{pid}/endpoints/{eid}/suspend")
    assert r.status_code == 200, r.text
    ops = api.wait_operations(pid, [o["id"] for o in r.json()["operations"]])
    assert [o["status"] for o in ops] == ["finished"], ops
    assert _endpoint(api, pid, eid)["current_state"] == "idle"


def _postmasters(data_dir: Path, pid: str) -> list[Path]:
    return list(data_dir.glob(f"projects/{pid}/branches/*/pgdata/postmaster.pid"))


def _starts(api: Api, pid: str) -> list[dict[str, Any]]:
    return [o for o in _ops(api, pid) if o["action"] == "start_compute"]


# -- wake on connect ------------------------------------------------------------------------


def test_psql_and_psycopg_wake_a_suspended_compute(api: Api, server: Server) -> None:
    project = api.create_ready_project(name="wake")
    pid, eid = project["project"]["id"], project["endpoints"][0]["id"]
    uri = project["connection_uris"][0]["connection_uri"]
    _suspend(api, pid, eid)
    assert _postmasters(server.data_dir, pid) == []

    done = subprocess.run(
        [pg_binary("psql"), plaintext(uri), "-At", "-c", "select current_user, ssl"
         " from pg_stat_ssl where pid = pg_backend_pid()"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    # The platform's own psql has no TLS (psycopg below wakes it over TLS); either way the
    # proxy reaches the compute on its socket.
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "neondb_owner|f"
    assert _endpoint(api, pid, eid)["current_state"] == "active"
    assert len(_starts(api, pid)) == 2  # the project's own, and the wake

    _suspend(api, pid, eid)
    with psycopg.connect(uri, connect_timeout=30) as conn:
        assert conn.info.pgconn.ssl_in_use
        assert conn.execute("select 41 + 1").fetchone() == (42,)
    assert len(_starts(api, pid)) == 3


def test_fifty_clients_share_one_start(api: Api) -> None:
    project = api.create_ready_project(name="crowd")
    pid, eid = project["project"]["id"], project["endpoints"][0]["id"]
    uri = project["connection_uris"][0]["connection_uri"]
    _suspend(api, pid, eid)
    before = len(_starts(api, pid))

    barrier = threading.Barrier(50)
    results: list[object] = []

    def client() -> None:
        barrier.wait()
        try:
            with psycopg.connect(uri, connect_timeout=60) as conn:
                results.append(conn.execute("select 1").fetchone())
        except Exception as exc:  # reported below, with every other outcome
            results.append(exc)

    threads = [threading.Thread(target=client) for _ in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert results == [(1,)] * 50
    starts = _starts(api, pid)
    assert len(starts) == before + 1, starts
    assert starts[0]["status"] == "finished"


def test_sni_routing_and_channel_binding(api: Api, server: Server) -> None:
    project = api.create_ready_project(name="sni")
    pid, eid = project["project"]["id"], project["endpoints"][0]["id"]
    params = project["connection_uris"][0]["connection_parameters"]
    host = project["endpoints"][0]["host"]
    assert host == f"{eid}.localhost:{server.proxy_port}"
    _suspend(api, pid, eid)
    name, port = host.rsplit(":", 1)
    # hostaddr connects; the name goes in TLS SNI, which is what routes.
    with psycopg.connect(
        host=name, hostaddr="127.0.0.1", port=port, user=params["role"],
        password=params["password"], dbname=params["database"], sslmode="require",
        channel_binding="require", connect_timeout=30,
    ) as conn:  # fmt: skip
        assert conn.execute("select current_database()").fetchone() == ("neondb",)


def test_plaintext_clients_and_cancel(api: Api) -> None:
    project = api.create_ready_project(name="cancel")
    uri = project["connection_uris"][0]["connection_uri"].replace(
        "sslmode=require", "sslmode=disable"
    )
    with psycopg.connect(uri, connect_timeout=30) as conn:
        assert not conn.info.pgconn.ssl_in_use
        timer = threading.Timer(0.5, conn.cancel)
        timer.start()
        # QueryCanceled, not the end of the 60 s: the CancelRequest reached its backend.
        with pytest.raises(errors.QueryCanceled):
            conn.execute("select pg_sleep(60)")
        timer.join()
        conn.rollback()
        assert conn.execute("select 1").fetchone() == (1,)


def test_errors_are_postgres_errors(api: Api, server: Server) -> None:
    project = api.create_ready_project(name="errors")
    pid, eid = project["project"]["id"], project["endpoints"][0]["id"]
    uri = project["connection_uris"][0]["connection_uri"]
    _suspend(api, pid, eid)
    before = len(_starts(api, pid))

    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        psycopg.connect(uri.replace(":npg_", ":wrong", 1), connect_timeout=30)
    # A wrong password wakes nothing.
    assert len(_starts(api, pid)) == before
    assert _endpoint(api, pid, eid)["current_state"] == "idle"

    # An endpoint nobody has fails as a wrong password: so does another account's.
    unknown = uri.replace(eid, "ep-no-such-endpoint-12345678")
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        psycopg.connect(unknown, connect_timeout=30)
    anonymous = uri.split("&options=")[0]
    with pytest.raises(psycopg.OperationalError, match="endpoint not specified"):
        psycopg.connect(anonymous, connect_timeout=30)

    r = api.http.patch(f"/projects/{pid}/endpoints/{eid}", json={"endpoint": {"disabled": True}})
    assert r.status_code == 200, r.text
    api.wait_operations(pid, [o["id"] for o in r.json()["operations"]])
    with pytest.raises(psycopg.OperationalError, match="is disabled"):
        psycopg.connect(uri, connect_timeout=30)
    # libpq keeps a refused connection's SQLSTATE to itself: read it off the wire.
    password = project["connection_uris"][0]["connection_parameters"]["password"]
    with pgclient.connect(server.proxy_port) as sock:
        refused = pgclient.authenticate(sock, endpoint=eid, user="neondb_owner", password=password)
    assert refused.code == "08004", refused
    # Through the API too: starting a disabled compute conflicts with its state.
    for action in ("start", "restart"):
        r = api.http.post(f"/projects/{pid}/endpoints/{eid}/{action}")
        assert r.status_code == 409 and "disabled" in r.json()["message"], r.text
    assert len(_starts(api, pid)) == before


# -- idle suspend ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def quick() -> Iterator[Server]:
    """A server whose computes suspend after 2 idle seconds (suspend_timeout_seconds 0)."""
    with running_server(
        PGPLANE_DEFAULT_SUSPEND_TIMEOUT_SECONDS="2", PGPLANE_SCHEDULER_SECONDS="0.2"
    ) as srv:
        yield srv


def test_idle_compute_is_suspended_and_wakes_again(quick: Server) -> None:
    _, key = quick.create_key("idle@example.com")
    with Api(quick, key) as api:
        project = api.create_ready_project(name="idle")
        pid, eid = project["project"]["id"], project["endpoints"][0]["id"]
        uri = project["connection_uris"][0]["connection_uri"]
        with psycopg.connect(uri, connect_timeout=30) as conn:
            conn.execute("create table t as select 1 as v")
            # Busy for longer than the timeout: activity, not the clock, keeps it running.
            for _ in range(15):
                conn.execute("select 1")
                time.sleep(0.2)
            assert _endpoint(api, pid, eid)["current_state"] == "active"
        wait_for("the idle suspend", lambda: _endpoint(api, pid, eid)["current_state"] == "idle")
        suspends = [o for o in _ops(api, pid) if o["action"] == "suspend_compute"]
        assert [o["status"] for o in suspends] == ["finished"]
        assert _postmasters(quick.data_dir, pid) == []
        # Suspended no sooner than the timeout after the last activity the proxy recorded (the
        # store's microseconds: the API shows whole seconds).
        last_active, suspended_at = _stored_times(quick, eid)
        assert suspended_at - last_active >= 2_000_000, (last_active, suspended_at)
        with psycopg.connect(uri, connect_timeout=30) as conn:
            assert conn.execute("select v from t").fetchone() == (1,)


def test_never_suspend(quick: Server) -> None:
    _, key = quick.create_key("never@example.com")
    with Api(quick, key) as api:
        project = api.create_ready_project(name="never")
        control = api.create_ready_project(name="never-control")
        pid, eid = project["project"]["id"], project["endpoints"][0]["id"]
        cpid, ceid = control["project"]["id"], control["endpoints"][0]["id"]
        r = api.http.patch(
            f"/projects/{pid}/endpoints/{eid}", json={"endpoint": {"suspend_timeout_seconds": -1}}
        )
        assert r.status_code == 200, r.text
        api.wait_operations(pid, [o["id"] for o in r.json()["operations"]])
        # On a busy machine the scheduler may have suspended it (idle past the short default)
        # before the PATCH: started again, it now runs under "never".
        if _endpoint(api, pid, eid)["current_state"] != "active":
            r = api.http.post(f"/projects/{pid}/endpoints/{eid}/start")
            assert r.status_code == 200, r.text
            api.wait_operations(pid, [o["id"] for o in r.json()["operations"]])
        suspends = len([o for o in _ops(api, pid) if o["action"] == "suspend_compute"])
        idle_since = time.monotonic()
        # The control, on the default timeout and idle as long, shows the scheduler suspending...
        wait_for(
            "the control's idle suspend",
            lambda: _endpoint(api, cpid, ceid)["current_state"] == "idle",
        )
        # ...and the other is still up after five times the default timeout (the clock's own
        # condition), the scheduler having looked since.
        time.sleep(max(0.0, idle_since + 5 * 2 - time.monotonic()))
        quick.wait_for_ticks(2)
        assert _endpoint(api, pid, eid)["current_state"] == "active"
        assert len([o for o in _ops(api, pid) if o["action"] == "suspend_compute"]) == suspends


def test_activity_survives_a_restart(quick: Server) -> None:
    """Idleness is measured from the stored last activity: a restart does not reset it.

    The activity is made older than the timeout while the server is down; started again, the
    server must suspend the compute at its first idle check, not a timeout after its start (as
    one that took its start, or the compute's adoption, for activity would).
    """
    timeout = 6
    _, key = quick.create_key("restart@example.com")
    with Api(quick, key) as api:
        project = api.create_ready_project(name="restart")
        pid, eid = project["project"]["id"], project["endpoints"][0]["id"]
        uri = project["connection_uris"][0]["connection_uri"]
        r = api.http.patch(
            f"/projects/{pid}/endpoints/{eid}",
            json={"endpoint": {"suspend_timeout_seconds": timeout}},
        )
        assert r.status_code == 200, r.text
        api.wait_operations(pid, [o["id"] for o in r.json()["operations"]])
        started = _stored_times(quick, eid)[0]
        with psycopg.connect(uri, connect_timeout=30) as conn:
            conn.execute("select 1")
        recorded = wait_for(
            "activity in the store",
            lambda: (last := _stored_times(quick, eid)[0]) > started and last,
        )
        quick.stop()
        # Down until the stored activity is older than the timeout (the clock of the store's
        # times: microseconds since the epoch).
        time.sleep(max(0.0, recorded / 1e6 + timeout + 0.5 - time.time()))
        quick.start()
        back = time.time()
        assert _stored_times(quick, eid)[0] == recorded
        wait_for("the idle suspend", lambda: _endpoint(api, pid, eid)["current_state"] == "idle")
        suspended_at = _stored_times(quick, eid)[1]
        # At the first idle check after the start: well before a timeout after it.
        assert suspended_at / 1e6 - back < timeout / 2, (suspended_at / 1e6 - back, quick.log())


def _stored_times(server: Server, endpoint_id: str) -> tuple[int, int]:
    """The endpoint's ``last_active`` and ``suspended_at`` in the store, in microseconds."""
    row = store_sql(server).one(
        "SELECT last_active, suspended_at FROM endpoints WHERE id = ?", [endpoint_id]
    )
    assert row is not None
    return int(row[0] or 0), int(row[1] or 0)


def test_a_suspend_that_failed_is_tried_again() -> None:
    """The first idle suspend fails for good; the endpoint is left as it was (not pending
    ``idle`` for ever, which the scheduler would never touch again) and the next one succeeds."""
    with running_server(
        PGPLANE_DEFAULT_SUSPEND_TIMEOUT_SECONDS="2",
        PGPLANE_SCHEDULER_SECONDS="0.2",
        PGPLANE_MAX_ATTEMPTS="2",
        PGPLANE_RETRY_BASE_SECONDS="0.1",
        PGPLANE_FAILPOINTS="before:suspend_compute=2*raise",
    ) as server:
        _, key = server.create_key("failed-suspend@example.com")
        with Api(server, key) as api:
            project = api.create_ready_project(name="failed-suspend")
            pid, eid = project["project"]["id"], project["endpoints"][0]["id"]
            wait_for(
                "the idle suspend", lambda: _endpoint(api, pid, eid)["current_state"] == "idle"
            )
            suspends = [o for o in _ops(api, pid) if o["action"] == "suspend_compute"]
            assert [(o["status"], o["failures_count"]) for o in reversed(suspends)] == [
                ("failed", 2),
                ("finished", 0),
            ], suspends
            assert "pending_state" not in _endpoint(api, pid, eid)
            assert _postmasters(server.data_dir, pid) == []


# -- detach and reattach --------------------------------------------------------------------


def test_detach_and_reattach_keep_every_byte() -> None:
    with running_server(
        PGPLANE_DETACH_AFTER_SECONDS="2",
        PGPLANE_SCHEDULER_SECONDS="0.2",
        PGPLANE_DEFAULT_SUSPEND_TIMEOUT_SECONDS="600",
    ) as server:
        _, key = server.create_key("cold@example.com")
        with Api(server, key) as api:
            project = api.create_ready_project(name="cold")
            pid, eid = project["project"]["id"], project["endpoints"][0]["id"]
            uri = project["connection_uris"][0]["connection_uri"]
            with psycopg.connect(uri, connect_timeout=30) as conn:
                conn.execute("create table t as select g as v from generate_series(1, 10000) g")
            _suspend(api, pid, eid)
            branches = server.data_dir / "projects" / pid / "branches"
            before = tree_checksums(branches)
            assert before

            def detached() -> bool:
                ops = [o for o in _ops(api, pid) if o["action"] == "tenant_detach"]
                return bool(ops) and ops[0]["status"] == "finished"

            wait_for("tenant_detach", detached)
            assert not (server.data_dir / "projects" / pid).exists()
            assert (server.data_dir / "archive" / pid / "manifest.json").is_file()

            # A request that needs the data brings it back first, checksums verified.
            r = api.http.patch(
                f"/projects/{pid}", json={"project": {"history_retention_seconds": 3600}}
            )
            assert r.status_code == 200, r.text
            actions = [o["action"] for o in r.json()["operations"]]
            assert actions[0] == "tenant_reattach", actions
            api.wait_operations(pid, [o["id"] for o in r.json()["operations"]])
            # Every byte back; the new window then frees archived WAL no base state needs.
            after = tree_checksums(branches)
            assert after.items() <= before.items()
            assert [name for name in before.keys() - after.keys() if "/wal/" not in name] == []
            assert not (server.data_dir / "archive" / pid).exists()

            # Detached again, then woken by a connection: reattach, start, query.
            before_second = len([o for o in _ops(api, pid) if o["action"] == "tenant_detach"])
            wait_for(
                "a second detach",
                lambda: (
                    len([o for o in _ops(api, pid) if o["action"] == "tenant_detach"])
                    > before_second
                    and detached()
                ),
            )
            with psycopg.connect(uri, connect_timeout=60) as conn:
                assert conn.execute("select count(*), sum(v) from t").fetchone() == (
                    10000,
                    50005000,
                )
            latest = _ops(api, pid)
            assert [o["action"] for o in latest[:2]] == ["start_compute", "tenant_reattach"]
            assert all(o["status"] == "finished" for o in latest)


# -- availability checks --------------------------------------------------------------------


def test_availability_checks() -> None:
    with running_server(
        PGPLANE_AVAILABILITY_CHECK_SECONDS="1",
        PGPLANE_SCHEDULER_SECONDS="0.2",
        PGPLANE_MAX_ATTEMPTS="1",
    ) as server:
        _, key = server.create_key("check@example.com")
        with Api(server, key) as api:
            project = api.create_ready_project(name="checked")
            pid, eid = project["project"]["id"], project["endpoints"][0]["id"]
            bid = project["branch"]["id"]
            r = api.http.post(f"/projects/{pid}/branches", json={"branch": {"name": "bare"}})
            assert r.status_code == 201, r.text
            bare = r.json()["branch"]["id"]
            api.wait_operations(pid, [o["id"] for o in r.json()["operations"]])

            def checks() -> list[dict[str, Any]]:
                return [o for o in _ops(api, pid) if o["action"] == "check_availability"]

            wait_for("a finished check", lambda: any(o["status"] == "finished" for o in checks()))
            assert {o["branch_id"] for o in checks()} == {bid}  # the bare branch has no compute

            # A suspended compute is checked too: it must be able to start.
            _suspend(api, pid, eid)
            count = len(checks())
            wait_for("a check while suspended", lambda: len(checks()) > count + 1)
            assert all(o["status"] != "failed" for o in checks())
            assert _endpoint(api, pid, eid)["current_state"] == "idle"

            # Damage the data: the next check fails, with the reason.
            pgdata = server.data_dir / "projects" / pid / "branches" / bid / "pgdata"
            (pgdata / "global" / "pg_control").rename(pgdata / "pg_control.moved")
            failed = wait_for(
                "a failed check", lambda: [o for o in checks() if o["status"] == "failed"]
            )
            r = api.http.get(f"/projects/{pid}/operations/{failed[0]['id']}")
            assert "postmaster" in r.json()["operation"]["error"], r.text
            # A connection now gets the reason as a Postgres error, not a hang.
            uri = project["connection_uris"][0]["connection_uri"]
            with pytest.raises(psycopg.OperationalError, match="failed to start"):
                psycopg.connect(uri, connect_timeout=60)
            (pgdata / "pg_control.moved").rename(pgdata / "global" / "pg_control")
            del bare
