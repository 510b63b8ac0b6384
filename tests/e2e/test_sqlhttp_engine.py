"""SQL over HTTP's engine against a real compute, without HTTP: the handler the door calls, run in
this process, dialling the compute's own socket and logging in as the proxy does.

The platform's side of the seam (:class:`~pgplane.proxy.seam.Computes`) is a small stand-in that
answers from the real server: the role's password as the API returned it, the compute's socket
and port as the platform recorded them, and a wake that starts the endpoint through the API.
What the engine does with them (dial, log in, query, pool, cancel) is the real thing.
"""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

import pytest

from pgplane.compute.local.layout import Layout
from pgplane.proxy.activity import Activity
from pgplane.proxy.seam import Password, Route, Target, UnknownEndpoint
from pgplane.proxy.session import Sessions
from pgplane.proxy.sqlhttp import messages
from pgplane.proxy.sqlhttp.handler import Reply, SqlOverHttp
from pgplane.proxy.sqlhttp.pool import Pool
from pgplane.proxy.sqlhttp.run import Limits
from pgplane.proxy.throttle import LoginThrottle
from tests.stores import store_sql
from tests.support import Api, Server


class Platform:
    """The seam for one endpoint, answered from the running server."""

    def __init__(self, server: Server, api: Api, project: dict[str, Any]) -> None:
        self.server, self.api = server, api
        self.project_id = project["project"]["id"]
        self.endpoint_id = project["endpoints"][0]["id"]
        parts = urlsplit(project["connection_uris"][0]["connection_uri"])
        self.role, self.password = parts.username or "", parts.password or ""
        self.wakes = 0

    async def route(self, endpoint_id: str, role: str, *, client: str) -> Route:
        if endpoint_id != self.endpoint_id:
            raise UnknownEndpoint(endpoint_id)
        state = await asyncio.to_thread(self.api.endpoint, self.project_id, endpoint_id)
        running = state["current_state"] == "active"
        secret = Password(self.password) if role == self.role else None
        return Route(secret=secret, target=self.target() if running else None)

    async def wake(self, endpoint_id: str, *, force: bool) -> Target:
        self.wakes += 1
        await asyncio.to_thread(self._start)
        return self.target()

    def _start(self) -> None:
        r = self.api.http.post(f"/projects/{self.project_id}/endpoints/{self.endpoint_id}/start")
        assert r.status_code == 200, r.text
        self.api.wait_operations(self.project_id, [o["id"] for o in r.json()["operations"]])

    def target(self) -> Target:
        (port,) = store_sql(self.server).rows(
            "SELECT port FROM endpoints WHERE id = ?", [self.endpoint_id]
        )[0]
        socket = Layout(self.server.data_dir.resolve()).socket_dir(self.endpoint_id)
        return Target(self.endpoint_id, "127.0.0.1", port, socket / f".s.PGSQL.{port}")

    def uri(self, password: str | None = None) -> str:
        return (
            f"postgresql://{self.role}:{password or self.password}@localhost/neondb"
            f"?sslmode=require&options=endpoint%3D{self.endpoint_id}"
        )


def _headers(platform: Platform, **given: str) -> list[tuple[str, str]]:
    """The driver's headers; ``Neon_Array_Mode="false"`` replaces one, others are added."""
    headers = {
        "Neon-Connection-String": platform.uri(),
        "Neon-Raw-Text-Output": "true",
        "Neon-Array-Mode": "true",
        "Content-Type": "text/plain;charset=UTF-8",
    }
    headers.update({k.replace("_", "-"): v for k, v in given.items()})
    return list(headers.items())


async def _sql(
    engine: SqlOverHttp,
    platform: Platform,
    body: dict[str, Any],
    headers: list[tuple[str, str]] | None = None,
) -> tuple[int, Any]:
    reply: Reply = await engine.answer(
        headers or _headers(platform), json.dumps(body).encode(), "127.0.0.1"
    )
    return reply.status, json.loads(reply.body)


@pytest.fixture
def platform(server: Server, api: Api) -> Platform:
    return Platform(server, api, api.create_ready_project(name="sqlhttp-engine"))


def _engine(
    platform: Platform, pool: Pool | None = None, **limits: Any
) -> tuple[SqlOverHttp, Activity, Pool]:
    activity, pool = Activity(), pool or Pool()
    sessions = Sessions(
        computes=platform,
        activity=activity,
        proxy_host="localhost",
        throttle=LoginThrottle(),
        handshake_timeout=30,
    )
    engine = SqlOverHttp(sessions=sessions, limits=Limits(**limits), pool=pool)
    return engine, activity, pool


async def test_queries_batches_and_errors_on_a_real_compute(platform: Platform) -> None:
    engine, activity, _ = _engine(platform)
    try:
        status, body = await _sql(
            engine,
            platform,
            {"query": "SELECT $1::int + 1 AS x, $2::text AS y", "params": ["41", None]},
        )
        assert status == 200, body
        assert body["command"] == "SELECT" and body["rowCount"] == 1
        assert body["rows"] == [["42", None]] and body["rowAsArray"] is True
        assert body["fields"][0] == {
            "name": "x",
            "dataTypeID": 23,
            "tableID": 0,
            "columnID": 0,
            "dataTypeSize": 4,
            "dataTypeModifier": -1,
            "format": "text",
        }
        assert list(activity.sample(1)) == [platform.endpoint_id]  # a request is activity

        # Objects keyed by field name without array mode; a table's fields name it.
        status, body = await _sql(
            engine, platform, {"query": "CREATE TABLE t (id int PRIMARY KEY, v text)"}
        )
        assert (status, body["command"], body["rowCount"]) == (200, "CREATE", None)
        status, body = await _sql(
            engine,
            platform,
            {"query": "INSERT INTO t VALUES (1, 'a'), (2, NULL) RETURNING *"},
            _headers(platform, Neon_Array_Mode="false"),
        )
        assert status == 200, body
        assert (body["command"], body["rowCount"]) == ("INSERT", 2)
        assert body["rows"] == [{"id": "1", "v": "a"}, {"id": "2", "v": None}]
        assert body["fields"][0]["tableID"] > 0 and body["fields"][0]["columnID"] == 1

        # A batch is one transaction, with the isolation asked; its results in order.
        status, body = await _sql(
            engine,
            platform,
            {
                "queries": [
                    {"query": "SHOW transaction_isolation"},
                    {"query": "SELECT current_setting('transaction_read_only')"},
                    {"query": "UPDATE t SET v = $1 WHERE id = 2", "params": ["b"]},
                ]
            },
            _headers(platform, Neon_Batch_Isolation_Level="RepeatableRead"),
        )
        assert status == 200, body
        results = body["results"]
        assert results[0]["rows"] == [["repeatable read"]]
        assert results[1]["rows"] == [["off"]]
        assert (results[2]["command"], results[2]["rowCount"]) == ("UPDATE", 1)

        # An error carries every field Postgres sent; the batch it ended is rolled back.
        status, body = await _sql(
            engine,
            platform,
            {
                "queries": [
                    {"query": "UPDATE t SET v = 'lost' WHERE id = 1"},
                    {"query": "INSERT INTO t VALUES (1, 'dup')"},
                    {"query": "UPDATE t SET v = 'never' WHERE id = 2"},
                ]
            },
        )
        assert status == 400
        assert body["code"] == "23505" and body["severity"] == "ERROR"
        assert body["constraint"] == "t_pkey" and body["table"] == "t"
        assert "duplicate key" in body["message"] and body["detail"]
        status, body = await _sql(engine, platform, {"query": "SELECT v FROM t ORDER BY id"})
        assert body["rows"] == [["a"], ["b"]]

        status, body = await _sql(engine, platform, {"query": "SELECT nope FROM t"})
        assert (status, body["code"], body["position"]) == (400, "42703", "8")

        # A read-only batch refuses writes.
        status, body = await _sql(
            engine,
            platform,
            {"queries": [{"query": "DELETE FROM t"}]},
            _headers(platform, Neon_Batch_Read_Only="true"),
        )
        assert (status, body["code"]) == (400, "25006")
    finally:
        engine.close()


async def test_connections_are_pooled_and_reset(platform: Platform) -> None:
    engine, _, pool = _engine(platform)
    key = (platform.endpoint_id, platform.role, "neondb", ())
    try:
        _, first = await _sql(engine, platform, {"query": "SELECT pg_backend_pid()"})
        await _sql(engine, platform, {"query": "SET search_path TO nowhere"})
        _, second = await _sql(engine, platform, {"query": "SELECT pg_backend_pid()"})
        assert first["rows"] == second["rows"]  # one backend served them all
        await pool.settled()
        assert pool.counts(key) == (1, 1)
        _, body = await _sql(engine, platform, {"query": "SHOW search_path"})
        assert body["rows"] == [['"$user", public']]  # what one request set is gone

        # A request that leaves a transaction open does not give its connection back.
        await _sql(engine, platform, {"query": "BEGIN"})
        await pool.settled()
        assert pool.counts(key) == (0, 0)

        # Idle pooled connections do not keep a compute up: it suspends, they are dropped, and
        # the next request wakes it.
        await _sql(engine, platform, {"query": "SELECT 1"})
        await pool.settled()
        assert pool.counts(key) == (1, 1)
        await asyncio.to_thread(platform.api.suspend, platform.project_id, platform.endpoint_id)
        status, body = await _sql(engine, platform, {"query": "SELECT 2"})
        assert (status, body["rows"]) == (200, [["2"]])
        assert platform.wakes == 1
    finally:
        engine.close()


# What a session can be left holding, and the request that leaves each.
_LEFTOVERS = [
    "SET search_path TO nowhere",
    "SELECT set_config('app.tenant', 'first', false)",
    "SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY",
    "CREATE TEMP TABLE leftover (x int)",
    "PREPARE leftover AS SELECT 1",
    "DECLARE leftover CURSOR WITH HOLD FOR SELECT 1",
    "LISTEN leftover",
    "SELECT pg_advisory_lock(42)",
]
# How the next request finds its session: as new, and on the same backend (a reset one is
# waited for rather than a new one opened).
_STATE = """SELECT pg_backend_pid() AS pid,
    current_setting('search_path') AS search_path,
    coalesce(current_setting('app.tenant', true), '') AS tenant,
    current_setting('default_transaction_read_only') AS read_only,
    (SELECT count(*) FROM pg_class WHERE relname IN ('leftover', 'in_batch')) AS tables,
    (SELECT count(*) FROM pg_prepared_statements) AS prepared,
    (SELECT count(*) FROM pg_cursors WHERE name <> '') AS cursors,
    (SELECT count(*) FROM pg_listening_channels()) AS channels,
    (SELECT count(*) FROM pg_locks WHERE locktype = 'advisory') AS locks,
    now() >= $1::timestamptz AS own_transaction"""
_AS_NEW = {
    "search_path": '"$user", public',
    "tenant": "",
    "read_only": "off",
    "tables": "0",
    "prepared": "0",
    "cursors": "0",
    "channels": "0",
    "locks": "0",
    "own_transaction": "t",
}


@pytest.mark.parametrize("reset", ["ahead", "idle"])
async def test_what_a_request_leaves_never_reaches_the_next(platform: Platform, reset: str) -> None:
    # The next request resets its session first, in its own pipeline ("ahead"); a connection
    # left idle a while is reset where it lies, and the next request finds it clean ("idle").
    settle = 3600.0 if reset == "ahead" else 0.0
    engine, _, pool = _engine(platform, Pool(settle_seconds=settle))
    headers = _headers(platform, Neon_Array_Mode="false")

    async def state() -> dict[str, str]:
        if reset == "idle":
            await pool.reset_idle()
        # Its transaction began after the request was sent: no earlier one left open.
        sent = datetime.now(UTC).isoformat()
        status, body = await _sql(engine, platform, {"query": _STATE, "params": [sent]}, headers)
        assert status == 200, body
        (row,) = body["rows"]
        return dict(row)

    try:
        pid = (await state())["pid"]
        for leftover in _LEFTOVERS:
            status, body = await _sql(engine, platform, {"query": leftover})
            assert status == 200, (leftover, body)
            assert await state() == {"pid": pid, **_AS_NEW}, leftover

        # A batch that fails midway: its transaction rolled back, its connection kept, clean.
        failing = [
            {"query": "CREATE TEMP TABLE in_batch (x int)"},
            {"query": "SET LOCAL search_path TO nowhere"},
            {"query": "SELECT 1 / 0"},
        ]
        status, body = await _sql(engine, platform, {"queries": failing})
        assert (status, body["code"]) == (400, "22012")
        assert await state() == {"pid": pid, **_AS_NEW}

        # A transaction left open, then an error in it: that connection is closed, not reset.
        status, body = await _sql(engine, platform, {"query": "BEGIN"})
        assert status == 200, body
        after = await state()
        assert after["pid"] != pid and after == {"pid": after["pid"], **_AS_NEW}
        key = (platform.endpoint_id, platform.role, "neondb", ())
        await pool.settled()
        assert pool.counts(key) == (1, 1)
    finally:
        engine.close()


async def test_a_failed_reset_runs_nothing_and_a_lock_left_does_not_outlast_the_settle(
    platform: Platform,
) -> None:
    engine, _, pool = _engine(platform, Pool(settle_seconds=3600.0))
    key = (platform.endpoint_id, platform.role, "neondb", ())
    try:
        await _sql(engine, platform, {"query": "CREATE TABLE runs (pid int)"})
        _, body = await _sql(engine, platform, {"query": "SELECT pg_backend_pid()"})
        [[first_pid]] = body["rows"]
        # The pooled session is not what the pool thinks (left in a transaction block): the
        # reset ahead of the next request fails, so the request runs on a new connection,
        # once, and the old one is closed.
        conn = await pool.acquire(key, wait=0)
        assert conn is not None and conn.dirty
        conn.side.write(messages.simple_query("BEGIN"))
        while (await conn.side.read_frame(limit=1 << 16))[0] != b"Z":
            pass
        pool.release(conn, reusable=True)
        status, body = await _sql(
            engine, platform, {"query": "INSERT INTO runs SELECT pg_backend_pid() RETURNING pid"}
        )
        assert status == 200, body
        [[ran_on]] = body["rows"]
        assert ran_on != first_pid and conn.state == "gone"
        _, body = await _sql(engine, platform, {"query": "SELECT pid FROM runs"})
        assert body["rows"] == [[ran_on]]
        assert pool.counts(key) == (1, 1)
    finally:
        engine.close()

    # A lock a request left is let go once its connection has been idle for the settle time,
    # though no request came for it: another session takes it.
    engine, _, pool = _engine(platform, Pool(settle_seconds=0.05))
    other, _, _ = _engine(platform)
    try:
        status, _ = await _sql(engine, platform, {"query": "SELECT pg_advisory_lock(42)"})
        assert status == 200
        try_lock = {"query": "SELECT pg_try_advisory_lock(42)"}
        async with asyncio.timeout(30):
            while (await _sql(other, platform, try_lock))[1]["rows"] != [["t"]]:
                await asyncio.sleep(0.02)
        await pool.settled()
        assert pool.counts(key) == (1, 1)
    finally:
        engine.close()
        other.close()


# Rows as they are made (a set-returning function in FROM would be made whole first).
_ENDLESS = "SELECT {}, generate_series(1, 1000000000)"


async def test_time_and_size_bounds_cancel_the_query(platform: Platform) -> None:
    engine, _, pool = _engine(platform, seconds=1.0, response_bytes=100_000, rows=10_000)
    key = (platform.endpoint_id, platform.role, "neondb", ())
    try:
        status, body = await _sql(engine, platform, {"query": "SELECT pg_sleep(60)"})
        assert (status, body["code"]) == (400, "57014")
        assert "time limit" in body["message"]
        # Cancelled on the compute, not left running: the connection is back, idle.
        await pool.settled()
        assert pool.counts(key) == (1, 1)
        _, body = await _sql(
            engine,
            platform,
            {"query": "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'SELECT pg_sleep%'"},
        )
        assert body["rows"] == [["0"]]

        status, body = await _sql(engine, platform, {"query": _ENDLESS.format("repeat('x', 100)")})
        assert status == 507, body
        assert "response is too large" in body["message"]
        status, body = await _sql(engine, platform, {"query": _ENDLESS.format("1")})
        assert status == 507
        # One value larger than the whole bound.
        status, body = await _sql(engine, platform, {"query": "SELECT repeat('x', 1000000)"})
        assert status == 507
        status, body = await _sql(engine, platform, {"query": "SELECT 'still here'"})
        assert (status, body["rows"]) == (200, [["still here"]])
    finally:
        engine.close()


async def test_wrong_passwords_and_strangers_wake_nothing(platform: Platform) -> None:
    engine, activity, _ = _engine(platform)
    try:
        await asyncio.to_thread(platform.api.suspend, platform.project_id, platform.endpoint_id)
        headers = _headers(platform, Neon_Connection_String=platform.uri("wrong"))
        status, body = await _sql(engine, platform, {"query": "SELECT 1"}, headers)
        assert (status, body["code"]) == (400, "28P01")
        stranger = platform.uri().replace(platform.role, "nobody")
        headers = _headers(platform, Neon_Connection_String=stranger)
        status, body = await _sql(engine, platform, {"query": "SELECT 1"}, headers)
        assert (status, body["code"]) == (400, "28P01")
        assert platform.wakes == 0 and activity.sample(1) == {}
    finally:
        engine.close()
