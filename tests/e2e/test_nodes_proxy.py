"""One proxy address for all: three nodes on one PostgreSQL store, and clients that connect
through node A (or B) to computes of projects placed on node C.

Each door of A's proxy reaches C's computes over the node channel and wakes them there (the
start runs on C, once): psycopg over TCP and TLS, with a cancel request; Neon's serverless driver
over a WebSocket and over HTTP (``/sql``). A's walls hold for them as for its own: the allow-list
is checked against the client's own address (127.0.0.2 through A, which itself dials C from
127.0.0.1), wrong passwords are throttled by the node the client reached, and nothing wakes
before the password. The API's direct reads of a project's data (its schema, at a point of its
history too) are answered alike through every node; and a project whose node is down is
refused at connect with a retryable error naming the node.
"""

from __future__ import annotations

import signal
import struct
import threading
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

import psycopg
import pytest

from pgplane.proxy import wire
from tests import pgclient, serverless
from tests.nodes import attempts, cli, home, running_nodes, wait_down
from tests.support import Api, Server, spend_refill, wait_for

OTHER = "127.0.0.2"
# The names each test's project takes: all made on node-c up front (the other nodes cordoned).
ON_C = (
    *("wake", "many", "cancel", "sqlrole", "ws", "sql", "old-driver"),
    *("allow", "throttle", "reads", "down"),
)


@pytest.fixture(scope="module")
def servers() -> Iterator[tuple[Server, Server, Server]]:
    with running_nodes(3) as (a, b, c):
        yield a, b, c


@pytest.fixture(scope="module")
def apis(servers: tuple[Server, Server, Server]) -> Iterator[tuple[Api, Api, Api]]:
    _, key = servers[0].create_key("nodes-proxy@example.com")
    with Api(servers[0], key) as a, Api(servers[1], key) as b, Api(servers[2], key) as c:
        yield a, b, c


@pytest.fixture(scope="module")
def on_c(
    servers: tuple[Server, Server, Server], apis: tuple[Api, Api, Api]
) -> dict[str, dict[str, Any]]:
    """A project on node-c for each test, created through node A's API (the others cordoned)."""
    a, _, c = servers
    cli(a, "nodes", "cordon", "node-a")
    cli(a, "nodes", "cordon", "node-b")
    try:
        made = {name: apis[0].create_ready_project(name=name) for name in ON_C}
    finally:
        cli(a, "nodes", "uncordon", "node-a")
        cli(a, "nodes", "uncordon", "node-b")
    for project in made.values():
        assert home(servers, project["project"]["id"]) is c
    return made


def _ids(project: dict[str, Any]) -> tuple[str, str]:
    return project["project"]["id"], project["endpoints"][0]["id"]


def _starts(api: Api, pid: str) -> list[str]:
    return [o["id"] for o in api.operations(pid) if o["action"] == "start_compute"]


def _credentials(uri: str) -> dict[str, str]:
    parts = urlsplit(uri)
    return {
        "endpoint": dict(parse_qsl(parts.query))["options"].removeprefix("endpoint="),
        "user": unquote(parts.username or ""),
        "password": unquote(parts.password or ""),
        "database": parts.path.lstrip("/"),
    }


def _login_from(port: int, source: str, uri: str, **override: str) -> tuple[str, str]:
    """A login through the proxy at ``port`` from ``source``, up to ReadyForQuery: ("", "")
    once in, else the refusal's SQLSTATE and message (before the password was asked for or
    after it was proven)."""
    login = pgclient.login(port, source=source, **{**_credentials(uri), **override})
    with login.sock as sock:
        if login.error is not None:
            return login.code or "", login.error
        while True:
            kind, payload = pgclient._read_message(sock)
            if kind == b"E":
                fields = wire.error_fields(payload)
                return fields.get("C", ""), fields.get("M", "")
            if kind == b"Z":
                sock.sendall(b"X" + struct.pack("!I", 4))
                return "", ""


def test_psycopg_through_node_a_wakes_a_compute_on_node_c(
    servers: tuple[Server, Server, Server],
    apis: tuple[Api, Api, Api],
    on_c: dict[str, dict[str, Any]],
) -> None:
    a, b, c = servers
    pid, eid = _ids(on_c["wake"])
    # The URI node A's API gives names A's proxy.
    uri = on_c["wake"]["connection_uris"][0]["connection_uri"]
    assert f":{a.proxy_port}/" in uri
    apis[1].suspend(pid, eid)  # asked of node B; run on node C
    before = _starts(apis[0], pid)
    with psycopg.connect(uri, connect_timeout=60) as conn:
        assert conn.info.pgconn.ssl_in_use
        assert conn.execute("SELECT current_user, 1").fetchone() == ("neondb_owner", 1)
        conn.execute("CREATE TABLE t AS SELECT 7 AS v")
        conn.commit()
    woke = [op for op in _starts(apis[0], pid) if op not in before]
    assert len(woke) == 1
    # The start ran on the project's node, and only there.
    assert woke[0] in attempts(c)
    assert woke[0] not in attempts(a) + attempts(b)
    assert apis[2].endpoint(pid, eid)["current_state"] == "active"
    # Through B's proxy too, plaintext this time, the same compute (nothing woken again).
    plain = uri.replace(f":{a.proxy_port}/", f":{b.proxy_port}/")
    with psycopg.connect(plain, connect_timeout=60, sslmode="disable") as conn:
        assert conn.execute("SELECT v FROM t").fetchone() == (7,)
    assert len(_starts(apis[0], pid)) == len(before) + 1


def test_clients_through_two_nodes_at_once_share_one_start_on_node_c(
    servers: tuple[Server, Server, Server],
    apis: tuple[Api, Api, Api],
    on_c: dict[str, dict[str, Any]],
) -> None:
    a, b, _ = servers
    pid, eid = _ids(on_c["many"])
    uri = on_c["many"]["connection_uris"][0]["connection_uri"]
    apis[0].suspend(pid, eid)
    before = _starts(apis[0], pid)
    uris = [uri, uri.replace(f":{a.proxy_port}/", f":{b.proxy_port}/")] * 8
    results: list[object] = []

    def connect(conninfo: str) -> None:
        try:
            with psycopg.connect(conninfo, connect_timeout=60) as conn:
                results.append(conn.execute("SELECT 1").fetchone())
        except psycopg.Error as exc:
            results.append(exc)

    clients = [threading.Thread(target=connect, args=(u,)) for u in uris]
    for client in clients:
        client.start()
    for client in clients:
        client.join(120)
    assert results == [(1,)] * len(uris)
    assert len(_starts(apis[0], pid)) == len(before) + 1


def test_a_cancel_request_through_node_a_reaches_the_session_on_node_c(
    servers: tuple[Server, Server, Server], on_c: dict[str, dict[str, Any]]
) -> None:
    uri = on_c["cancel"]["connection_uris"][0]["connection_uri"]
    watching = psycopg.connect(uri, autocommit=True)  # each look a snapshot of its own
    with psycopg.connect(uri, connect_timeout=60) as conn, watching as watcher:
        failed: list[BaseException] = []

        def sleep() -> None:
            try:
                conn.execute("SELECT pg_sleep(60)")
            except psycopg.Error as exc:
                failed.append(exc)

        query = threading.Thread(target=sleep)
        started = time.monotonic()
        query.start()
        wait_for(
            "the query running",
            lambda: (
                watcher.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE query = 'SELECT pg_sleep(60)'"
                    " AND state = 'active'"
                ).fetchone()
                == (1,)
            ),
        )
        conn.cancel_safe()  # to node A's proxy, as libpq sends it: A passes it on to C
        query.join(60)
        assert not query.is_alive()
    assert len(failed) == 1 and isinstance(failed[0], psycopg.errors.QueryCanceled)
    assert time.monotonic() - started < 60


def test_a_role_made_with_sql_logs_in_through_node_a_with_its_password_of_now(
    on_c: dict[str, dict[str, Any]],
) -> None:
    uri = on_c["sqlrole"]["connection_uris"][0]["connection_uri"]
    with psycopg.connect(uri, connect_timeout=60, autocommit=True) as owner:
        owner.execute("CREATE ROLE app LOGIN PASSWORD 'first-secret'")
        with psycopg.connect(uri, user="app", password="first-secret") as app:
            assert app.execute("SELECT current_user").fetchone() == ("app",)
        # Changed with SQL: node A asks node C, which asks the compute; the next login knows.
        owner.execute("ALTER ROLE app PASSWORD 'second-secret'")
    with pytest.raises(
        psycopg.OperationalError, match='password authentication failed for user "app"'
    ):
        psycopg.connect(uri, user="app", password="first-secret")
    with psycopg.connect(uri, user="app", password="second-secret") as app:
        assert app.execute("SELECT 1").fetchone() == (1,)


def test_the_serverless_driver_over_a_websocket_through_node_a(
    servers: tuple[Server, Server, Server],
    apis: tuple[Api, Api, Api],
    on_c: dict[str, dict[str, Any]],
) -> None:
    a = servers[0]
    pid, eid = _ids(on_c["ws"])
    apis[0].suspend(pid, eid)
    before = _starts(apis[0], pid)
    out = serverless.run(
        serverless.install(serverless.LATEST),
        "pool",
        uri=on_c["ws"]["connection_uris"][0]["connection_uri"],
        ws_proxy=f"127.0.0.1:{a.proxy_port}/v2",
        ca_file=a.data_dir / "tls" / "ca.crt",
    )
    assert out == {"seen": [1, 1], "counts": {"kept": 1, "dropped": 0}, "user": "neondb_owner"}
    woke = [op for op in _starts(apis[0], pid) if op not in before]
    assert len(woke) == 1 and woke[0] in attempts(servers[2])


def test_neon_over_http_through_node_a(
    servers: tuple[Server, Server, Server],
    apis: tuple[Api, Api, Api],
    on_c: dict[str, dict[str, Any]],
) -> None:
    a = servers[0]
    pid, eid = _ids(on_c["sql"])
    apis[0].suspend(pid, eid)
    before = _starts(apis[0], pid)
    out = serverless.run_http(
        serverless.install(serverless.LATEST),
        "neon",
        uri=on_c["sql"]["connection_uris"][0]["connection_uri"],
        fetch_endpoint=f"https://localhost:{a.proxy_port}/sql",
        ca_file=a.data_dir / "tls" / "ca.crt",
    )
    assert "fatal" not in out, out
    assert out["tagged"][0]["x"] == 42
    assert out["tx"] == [[], [{"transaction_isolation": "serializable"}], [{"n": 1}]]
    assert (out["txError"]["code"], out["txError"]["constraint"]) == ("23505", "items_pkey")
    assert out["query"] == [{"v": "by query()"}]
    woke = [op for op in _starts(apis[0], pid) if op not in before]
    assert len(woke) == 1 and woke[0] in attempts(servers[2])


@pytest.mark.slow
def test_the_older_serverless_driver_through_node_a_on_both_of_its_doors(
    servers: tuple[Server, Server, Server],
    apis: tuple[Api, Api, Api],
    on_c: dict[str, dict[str, Any]],
) -> None:
    a = servers[0]
    pid, eid = _ids(on_c["old-driver"])
    uri = on_c["old-driver"]["connection_uris"][0]["connection_uri"]
    old = serverless.install(serverless.OLD)
    apis[0].suspend(pid, eid)
    out = serverless.run(
        old, "drizzle", uri=uri, ws_proxy=f"127.0.0.1:{a.proxy_port}/v2", secure=False
    )
    assert out == {"values": [41]}
    apis[0].suspend(pid, eid)
    out = serverless.run_http(
        old, "neon", uri=uri, fetch_endpoint=f"http://127.0.0.1:{a.proxy_port}/sql"
    )
    assert "fatal" not in out, out
    assert out["query"] == [{"v": "by query()"}]


def test_the_allow_list_holds_for_the_clients_own_address_through_node_a(
    servers: tuple[Server, Server, Server],
    apis: tuple[Api, Api, Api],
    on_c: dict[str, dict[str, Any]],
) -> None:
    a = servers[0]
    pid, eid = _ids(on_c["allow"])
    uri = on_c["allow"]["connection_uris"][0]["connection_uri"]
    # Only 127.0.0.2: not the address node A dials node C's door from (127.0.0.1).
    r = apis[1].http.patch(
        f"/projects/{pid}", json={"project": {"settings": {"allowed_ips": {"ips": [OTHER]}}}}
    )
    assert r.status_code == 200, r.text
    apis[0].suspend(pid, eid)
    before = _starts(apis[0], pid)
    refused = _login_from(a.proxy_port, "127.0.0.1", uri)
    assert refused[0] == "XX000"
    assert refused[1].startswith("This IP address 127.0.0.1 is not allowed"), refused
    assert _login_from(a.proxy_port, "127.0.0.1", uri, password="wrong")[0] == "XX000"
    assert _starts(apis[0], pid) == before  # nothing woke for an address off the list
    # From the listed address, through A: node C checks the same address (the client's) and
    # wakes its compute.
    assert _login_from(a.proxy_port, OTHER, uri) == ("", "")
    assert len(_starts(apis[0], pid)) == len(before) + 1


def test_wrong_passwords_through_node_a_are_throttled_before_anything_wakes(
    servers: tuple[Server, Server, Server],
    apis: tuple[Api, Api, Api],
    on_c: dict[str, dict[str, Any]],
) -> None:
    a, b, _ = servers
    pid, eid = _ids(on_c["throttle"])
    uri = on_c["throttle"]["connection_uris"][0]["connection_uri"]
    apis[0].suspend(pid, eid)
    before = _starts(apis[0], pid)
    refusals = [_login_from(a.proxy_port, OTHER, uri, password="guess")[0] for _ in range(30)]
    assert set(refusals) == {"28P01"}
    # Even the right password, now.
    spend_refill(
        lambda: _login_from(a.proxy_port, OTHER, uri, password="guess"),
        lambda answer: answer[0] == "28P01",
    )
    throttled = _login_from(a.proxy_port, OTHER, uri)
    assert throttled[0] == "08004" and "too many failed logins" in throttled[1], throttled
    assert _starts(apis[0], pid) == before
    assert apis[0].endpoint(pid, eid)["current_state"] == "idle"
    # Each node throttles what reaches it (the README states the bound): B lets the owner in.
    assert _login_from(b.proxy_port, OTHER, uri) == ("", "")


def test_the_apis_direct_reads_are_answered_through_every_node(
    servers: tuple[Server, Server, Server],
    apis: tuple[Api, Api, Api],
    on_c: dict[str, dict[str, Any]],
) -> None:
    project = on_c["reads"]
    pid, bid = project["project"]["id"], project["branch"]["id"]
    uri = project["connection_uris"][0]["connection_uri"]
    with psycopg.connect(uri, connect_timeout=60) as conn:
        conn.execute("CREATE TABLE read_me (id int PRIMARY KEY, note text)")
    schema = f"/projects/{pid}/branches/{bid}/schema"
    answers = [api.http.get(schema, params={"db_name": "neondb"}) for api in apis]
    assert [r.status_code for r in answers] == [200, 200, 200], [r.text for r in answers]
    assert len({r.json()["sql"] for r in answers}) == 1
    assert "CREATE TABLE public.read_me" in answers[0].json()["sql"]
    # Its history's bounds, read on node C for a request to node A: an LSN past the head is
    # refused as C's own API refuses it.
    past = {"db_name": "neondb", "lsn": "FF/0"}
    refusals = [api.http.get(schema, params=past) for api in apis]
    assert {r.status_code for r in refusals} == {400}, [r.text for r in refusals]
    assert len({r.json()["message"] for r in refusals}) == 1
    assert "never had this LSN" in refusals[0].json()["message"]
    # A database the branch does not have: the same 404 through A as on C.
    missing = [api.http.get(schema, params={"db_name": "nope"}) for api in apis[::2]]
    assert [r.status_code for r in missing] == [404, 404]


def test_a_project_whose_node_is_down_is_refused_at_connect_naming_it(
    servers: tuple[Server, Server, Server],
    apis: tuple[Api, Api, Api],
    on_c: dict[str, dict[str, Any]],
) -> None:
    a, _, c = servers
    project = on_c["down"]
    pid, bid = project["project"]["id"], project["branch"]["id"]
    uri = project["connection_uris"][0]["connection_uri"]
    c.stop(signal.SIGKILL)
    wait_down(a, "node-c")
    code, message = _login_from(a.proxy_port, "127.0.0.1", uri)
    assert code == "08006", (code, message)
    assert "node node-c is down" in message and "retry" in message, message
    with pytest.raises(psycopg.OperationalError, match="node-c is down"):
        psycopg.connect(uri, connect_timeout=30)
    # Its reads from the store still answer; its data's are the retryable 503 naming it.
    assert apis[0].http.get(f"/projects/{pid}").status_code == 200
    r = apis[0].http.get(f"/projects/{pid}/branches/{bid}/schema", params={"db_name": "neondb"})
    assert r.status_code == 503, r.text
    assert r.headers["Retry-After"]
    assert "node-c is down" in r.json()["message"]
