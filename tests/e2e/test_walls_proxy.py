"""Tenant walls at the proxy, tried as a stranger or a tenant would, through the proxy itself.

Every login is authenticated by the proxy before anything is woken or reattached: wrong passwords
for a platform role, a role made with SQL and a role nobody made all fail alike and wake
nothing. What a client can make the proxy do before it is authenticated is bounded: key
derivation at a cost a tenant chose (its compute's ``scram_iterations``) stalls nobody, bytes
poured in before the session is piped are held back, and wrong passwords are throttled per
endpoint and address without touching other clients.
"""

from __future__ import annotations

import base64
import threading
import time
from pathlib import Path
from typing import Any, LiteralString

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from pgplane.compute.local.layout import Layout
from pgplane.proxy.throttle import HOLD_SECONDS, REFUSALS_AT_ONCE
from tests import pgclient
from tests.support import Api, Server, running_server, spend_refill, until_throttled, wait_for


def _starts(api: Api, pid: str) -> list[dict[str, Any]]:
    return [o for o in api.operations(pid) if o["action"] == "start_compute"]


def _as(uri: str, user: str, password: str) -> str:
    return make_conninfo(uri, user=user, password=password, connect_timeout=30)


def _refused(uri: str, user: str, password: str) -> None:
    with pytest.raises(
        psycopg.OperationalError, match=f'password authentication failed for user "{user}"'
    ):
        psycopg.connect(_as(uri, user, password))


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_no_wrong_password_wakes_a_compute(api: Api) -> None:
    project = api.create_ready_project(name="walls-wake")
    pid, eid = project["project"]["id"], project["endpoints"][0]["id"]
    uri = project["connection_uris"][0]["connection_uri"]
    with psycopg.connect(uri, connect_timeout=30, autocommit=True) as conn:
        conn.execute("CREATE ROLE made_with_sql LOGIN PASSWORD 'its-own-password'")
    api.suspend(pid, eid)  # what the compute knows of its roles is synced as it suspends
    before = len(_starts(api, pid))

    _refused(uri, "neondb_owner", "wrong")
    _refused(uri, "made_with_sql", "wrong")
    _refused(uri, "nobody_made_me", "anything")
    # The platform's own roles trust their private socket; through the proxy they are strangers.
    _refused(uri, "cloud_admin", "guess")
    _refused(uri, "pgplane_monitor", "guess")
    assert len(_starts(api, pid)) == before
    assert api.endpoint(pid, eid)["current_state"] == "idle"

    # With its password, the role made with SQL wakes the compute and logs in.
    with psycopg.connect(_as(uri, "made_with_sql", "its-own-password")) as conn:
        assert conn.execute("SELECT current_user").fetchone() == ("made_with_sql",)
    assert len(_starts(api, pid)) == before + 1


def test_a_role_made_with_sql_logs_in_at_once_and_on_its_branches(api: Api) -> None:
    project = api.create_ready_project(name="walls-sql-role")
    pid = project["project"]["id"]
    uri = project["connection_uris"][0]["connection_uri"]
    with psycopg.connect(uri, connect_timeout=30, autocommit=True) as conn:
        conn.execute("CREATE ROLE app LOGIN PASSWORD 'app-password'")
    # The compute runs: the proxy asks it for the role it has not seen yet.
    with psycopg.connect(_as(uri, "app", "app-password")) as conn:
        assert conn.execute("SELECT current_user").fetchone() == ("app",)
    _refused(uri, "app", "not-the-app-password")
    # Running or not, the platform's own roles are not for clients.
    _refused(uri, "cloud_admin", "guess")

    # A branch copies the role; its compute knows it from its first connection on.
    r = api.http.post(
        f"/projects/{pid}/branches",
        json={"branch": {"name": "child"}, "endpoints": [{"type": "read_write"}]},
    )
    child = api.settled(pid, r)
    child_eid = child["endpoints"][0]["id"]
    child_uri = child["connection_uris"][0]["connection_uri"]
    api.suspend(pid, child_eid)
    before = len(_starts(api, pid))
    _refused(child_uri, "app", "wrong")
    assert len(_starts(api, pid)) == before
    with psycopg.connect(_as(child_uri, "app", "app-password")) as conn:
        assert conn.execute("SELECT current_user").fetchone() == ("app",)

    # A password changed with SQL holds from the next login on: a leaked one, rotated, is dead.
    with psycopg.connect(uri, connect_timeout=30, autocommit=True) as conn:
        conn.execute("ALTER ROLE app PASSWORD 'rotated-password'")
    _refused(uri, "app", "app-password")
    with psycopg.connect(_as(uri, "app", "rotated-password")) as conn:
        assert conn.execute("SELECT current_user").fetchone() == ("app",)


def test_a_stranger_reattaches_nothing() -> None:
    with running_server(
        PGPLANE_DETACH_AFTER_SECONDS="2",
        PGPLANE_SCHEDULER_SECONDS="0.2",
        PGPLANE_DEFAULT_SUSPEND_TIMEOUT_SECONDS="600",
    ) as server:
        _, key = server.create_key("walls-cold@example.com")
        with Api(server, key) as api:
            project = api.create_ready_project(name="walls-cold")
            pid, eid = project["project"]["id"], project["endpoints"][0]["id"]
            uri = project["connection_uris"][0]["connection_uri"]
            api.suspend(pid, eid)

            def detached() -> bool:
                ops = [o for o in api.operations(pid) if o["action"] == "tenant_detach"]
                return bool(ops) and ops[0]["status"] == "finished"

            wait_for("tenant_detach", detached)
            _refused(uri, "neondb_owner", "wrong")
            _refused(uri, "nobody_made_me", "anything")
            actions = [o["action"] for o in api.operations(pid)]
            assert "tenant_reattach" not in actions
            assert not (server.data_dir / "projects" / pid).exists()
            # The owner, with the password, brings it back.
            with psycopg.connect(uri, connect_timeout=60) as conn:
                assert conn.execute("SELECT 1").fetchone() == (1,)


def _on_compute_as_admin(
    server: Server, endpoint_id: str, statement: LiteralString, params: tuple[object, ...]
) -> None:
    socket_dir = Layout(server.data_dir.resolve()).socket_dir(endpoint_id)
    [socket] = [p for p in socket_dir.glob(".s.PGSQL.*") if not p.name.endswith(".lock")]
    port = int(socket.name.rsplit(".", 1)[1])
    with psycopg.connect(
        host=str(socket_dir), port=port, user="cloud_admin", dbname="postgres", autocommit=True
    ) as conn:
        conn.execute(statement, params)


def test_a_huge_iteration_count_on_a_compute_stalls_nobody(
    api: Api, other_api: Api, server: Server
) -> None:
    """A tenant gives its own role a verifier of two billion PBKDF2 iterations (``SET
    scram_iterations`` then ``ALTER ROLE ... PASSWORD``). Before, the proxy derived that key on
    the event loop when it logged in to the compute, freezing every account for many minutes.

    The test writes the verifier directly: through ALTER ROLE, Postgres itself would spend those
    minutes first (it checks a new secret against the empty password), on the tenant's compute.
    """
    attacker = api.create_ready_project(name="walls-iterations")
    uri = attacker["connection_uris"][0]["connection_uri"]
    fake = base64.b64encode(b"k" * 32).decode()
    verifier = f"SCRAM-SHA-256$2000000000:c2FsdHNhbHQ=${fake}:{fake}"
    _on_compute_as_admin(
        server,
        attacker["endpoints"][0]["id"],
        "UPDATE pg_catalog.pg_authid SET rolpassword = %s WHERE rolname = %s",
        (verifier, "neondb_owner"),
    )
    victim = other_api.create_ready_project(name="walls-victim")
    victim_uri = victim["connection_uris"][0]["connection_uri"]

    results: list[object] = []

    def attack() -> None:
        try:
            with psycopg.connect(uri, connect_timeout=60) as conn:
                results.append(conn.execute("SELECT current_user").fetchone())
        except psycopg.Error as exc:
            results.append(exc)

    attackers = [threading.Thread(target=attack) for _ in range(3)]
    for t in attackers:
        t.start()
    # Meanwhile another account works as usual (each call would time out behind a frozen loop).
    for _ in range(10):
        r = other_api.http.get(f"/projects/{victim['project']['id']}", timeout=20)
        assert r.status_code == 200
        with psycopg.connect(victim_uri, connect_timeout=20) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
    for t in attackers:
        t.join(timeout=120)
    # The proxy logs in over the compute's private socket, which trusts it: the tenant's own
    # verifier is the compute's business, and the platform's password still works.
    assert results == [("neondb_owner",)] * 3, results


def test_a_verifier_of_any_size_reaches_neither_the_platform_nor_its_store(
    api: Api, server: Server
) -> None:
    """A tenant superuser writes a 32 MB "verifier" into pg_authid for a role of its own (on
    Postgres 15, whose pg_authid still has a TOAST table; 16 on bound it to a page). A
    login by that role is refused as a wrong password's, the verifier never read into the
    server (its memory stays where it was), and the suspend's sync of the roles leaves it out of
    the store; the project's other roles log in as before."""
    project = api.create_ready_project(name="walls-bloated-verifier", pg_version=15)
    pid, eid = project["project"]["id"], project["endpoints"][0]["id"]
    uri = project["connection_uris"][0]["connection_uri"]
    with psycopg.connect(uri, autocommit=True) as conn:
        conn.execute("CREATE ROLE bloated LOGIN")
    bloated = "SCRAM-SHA-256$4096:" + "A" * (32 << 20)
    _on_compute_as_admin(
        server,
        eid,
        "UPDATE pg_catalog.pg_authid SET rolpassword = %s WHERE rolname = %s",
        (bloated, "bloated"),
    )
    assert server.process is not None
    rss_before = _rss_kib(server.process.pid)
    for _ in range(3):
        with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
            psycopg.connect(_as(uri, "bloated", "anything"), connect_timeout=30)
    assert _rss_kib(server.process.pid) - rss_before < 16 << 10  # KiB: not the 32 MB
    api.suspend(pid, eid)  # the roles synced into the store
    store = server.data_dir / "pgplane.db"
    assert store.stat().st_size < 16 << 20
    assert b"A" * 4096 not in store.read_bytes()
    with psycopg.connect(uri, connect_timeout=60) as conn:
        assert conn.execute("SELECT current_user").fetchone() == ("neondb_owner",)


def test_bytes_before_a_session_starts_are_held_back() -> None:
    """Logged in while its compute wakes (held up by a failpoint), a client pours bytes: the
    proxy stops reading rather than keep them, so the server's memory stays where it was."""
    with running_server(PGPLANE_FAILPOINTS="before:start_compute=sleep(8000)") as server:
        _, key = server.create_key("walls-flood@example.com")
        with Api(server, key) as api:
            project = api.create_ready_project(name="walls-flood")
            pid, eid = project["project"]["id"], project["endpoints"][0]["id"]
            password = project["connection_uris"][0]["connection_parameters"]["password"]
            api.suspend(pid, eid)
            assert server.process is not None
            rss_before = _rss_kib(server.process.pid)
            login = pgclient.login(
                server.proxy_port, endpoint=eid, user="neondb_owner", password=password
            )
            assert login.error is None, login.error
            sock = login.sock
            sock.setblocking(False)
            chunk = b"\0" * (1 << 20)
            sent = 0
            deadline = time.monotonic() + 3
            while time.monotonic() < deadline:
                try:
                    sent += sock.send(chunk)
                except BlockingIOError:
                    time.sleep(0.01)
            rss_after = _rss_kib(server.process.pid)
            sock.close()
            # Socket buffers take a few MB; everything past them waits in the client.
            assert sent < 64 << 20, sent
            assert rss_after - rss_before < 64 << 10, (rss_before, rss_after)


def test_a_throttled_stranger_s_made_up_roles_open_nothing_on_the_compute(
    api: Api, server: Server
) -> None:
    """A role nobody told the platform of is looked up on the running compute, in a superuser
    session, before the client proves anything. A stranger throttled for its wrong passwords
    kept opening one such session per login by naming made-up roles (150 at once took the
    compute's connection slots from its owner); the throttle now comes first, and the lookups
    run two at a time per endpoint at most."""
    project = api.create_ready_project(name="walls-made-up-roles")
    eid = project["endpoints"][0]["id"]
    uri = project["connection_uris"][0]["connection_uri"]
    stranger = {"endpoint": eid, "source": "127.0.0.3", "password": "anything"}

    def guess() -> str | None:
        return pgclient.refusal(server.proxy_port, user="neondb_owner", **stranger)

    until_throttled(guess, lambda refusal: refusal is not None and "too many" not in refusal)

    with psycopg.connect(uri, connect_timeout=30, autocommit=True) as conn:
        before = _sessions(conn)
        throttled = 0
        for i in range(30):
            refusal = pgclient.refusal(server.proxy_port, user=f"made_up_{i}", **stranger)
            assert refusal is not None, i
            # The throttle lets one more guess through every 2 s: a slow loop meets a lapse.
            if "too many failed logins" in refusal:
                throttled += 1
            else:
                assert "password authentication failed" in refusal, refusal
        opened = _sessions(conn) - before
    assert throttled >= 10, throttled
    assert opened <= 3, opened  # the platform's own few at most (samples, syncs)
    with psycopg.connect(uri, connect_timeout=30) as conn:  # the owner, as ever
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_a_stranger_s_made_up_roles_are_looked_up_on_one_session_of_the_compute(
    api: Api, server: Server
) -> None:
    """Below the throttle, each login naming a role nobody told the platform of opened a
    superuser session on the running compute to look it up (20 logins, 20 sessions): anyone who
    knows an endpoint id could open them as fast as it dialled. The lookups share one session
    per compute now; a role made with SQL is still found (and its password changed with SQL
    holds at the next login)."""
    project = api.create_ready_project(name="walls-made-up-lookups")
    eid = project["endpoints"][0]["id"]
    uri = project["connection_uris"][0]["connection_uri"]
    stranger = {"endpoint": eid, "source": "127.0.0.9", "password": "anything"}
    with psycopg.connect(uri, connect_timeout=30, autocommit=True) as conn:
        conn.execute("CREATE ROLE made_with_sql LOGIN PASSWORD 'first-secret'")
        before = _sessions(conn)
        for i in range(20):
            refusal = pgclient.refusal(server.proxy_port, user=f"made_up_{i}", **stranger)
            assert refusal is not None and "password authentication failed" in refusal, refusal
        opened = _sessions(conn) - before
        assert opened <= 4, opened  # the lookups' one, and the platform's own few
        sql_role = {"endpoint": eid, "user": "made_with_sql", "source": "127.0.0.10"}
        assert pgclient.refusal(server.proxy_port, password="first-secret", **sql_role) is None
        conn.execute("ALTER ROLE made_with_sql PASSWORD 'second-secret'")
        refusal = pgclient.refusal(server.proxy_port, password="first-secret", **sql_role)
        assert refusal is not None and "password authentication failed" in refusal, refusal
        assert pgclient.refusal(server.proxy_port, password="second-secret", **sql_role) is None


def _sessions(conn: psycopg.Connection[Any]) -> int:
    """Sessions opened on the compute so far, in every database."""
    conn.execute("SELECT pg_stat_clear_snapshot()")
    row = conn.execute(
        "SELECT sum(sessions) FROM pg_stat_database WHERE datname IS NOT NULL"
    ).fetchone()
    assert row is not None
    return int(row[0])


def test_a_throttled_stranger_dialling_without_pause_is_answered_at_its_pace(
    server: Server,
) -> None:
    """Refusals are cheap but were written as fast as a stranger dialled: eight addresses
    dialling without pause took most of a core of the proxy's from every other account. A
    throttled address is told so at once a minute's worth of times, then once a second, the
    rest held before they are written."""
    stranger = {"endpoint": "ep-made-up-00000000", "user": "nobody", "source": "127.0.0.6"}

    def guess() -> str | None:
        return pgclient.refusal(server.proxy_port, password="x", **stranger)

    until_throttled(guess, lambda refusal: refusal is not None and "too many" not in refusal)
    answered_at_once = 0
    while answered_at_once < REFUSALS_AT_ONCE * 3:
        start = time.monotonic()
        refusal = guess()
        assert refusal is not None and "too many failed logins" in refusal, refusal
        if time.monotonic() - start >= HOLD_SECONDS * 0.9:
            break
        answered_at_once += 1
    else:
        raise AssertionError("no refusal held")
    # Not before a minute's worth (the refusal that showed the throttle was one of them).
    assert answered_at_once >= REFUSALS_AT_ONCE - 1, answered_at_once


def test_wrong_passwords_are_throttled_per_address(api: Api, server: Server) -> None:
    project = api.create_ready_project(name="walls-throttle")
    eid = project["endpoints"][0]["id"]
    uri = project["connection_uris"][0]["connection_uri"]
    password = project["connection_uris"][0]["connection_parameters"]["password"]
    guesser = {"endpoint": eid, "user": "neondb_owner", "source": "127.0.0.2"}
    failed = 'password authentication failed for user "neondb_owner"'

    def guess() -> str | None:
        return pgclient.refusal(server.proxy_port, password="guess", **guesser)

    refusals = [guess() for _ in range(30)]
    assert refusals[0] == failed
    last = until_throttled(guess, lambda refusal: refusal == failed)
    assert last is not None and "too many failed logins" in last
    # Refused before its password is looked at, right or wrong...
    spend_refill(guess, lambda refusal: refusal == failed)
    right = pgclient.refusal(server.proxy_port, password=password, **guesser)
    assert right is not None and "too many failed logins" in right
    # ...while everyone else logs in as usual.
    with psycopg.connect(uri, connect_timeout=30) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_a_mistyped_endpoint_and_a_wrong_password_fail_alike_with_a_hint(api: Api) -> None:
    """The owner who mistypes the endpoint id in the host is told to check it; a stranger
    learns nothing from the answer: a wrong password to an endpoint that exists reads the same,
    word for word, hint and all."""
    project = api.create_ready_project(name="walls-mistyped")
    uri = project["connection_uris"][0]["connection_uri"]
    eid = project["endpoints"][0]["id"]
    mistyped = uri.replace(eid, eid[:-1] + ("x" if eid[-1] != "x" else "y"))
    wrong = make_conninfo(uri, password="not-the-password", connect_timeout=10)
    said = []
    for attempt in (mistyped, wrong):
        with pytest.raises(psycopg.OperationalError) as refused:
            psycopg.connect(attempt, connect_timeout=10).close()
        said.append(str(refused.value))
    assert said[0] == said[1], said
    assert 'password authentication failed for user "neondb_owner"' in said[0], said[0]
    assert "the endpoint id in the host (ep-...): a mistyped one fails the same way" in said[0]
