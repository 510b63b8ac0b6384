"""Tenant walls at the proxy's ``POST /sql``, tried as a stranger or a tenant would, over HTTP.

Before a request is authenticated it wakes nothing: wrong passwords, roles nobody made, another
account's endpoint and addresses off the project's IP allow-list are all refused with the compute
left asleep, another account's endpoint exactly as one that does not exist, and wrong passwords
are throttled per endpoint and address, together with the other doors'. Once in, what a request
may take is bounded: a query that never ends is cancelled on the compute at the time bound, an
answer that would not fit in memory stops at the size bound (the proxy's memory stays flat), and
a body past its bound is refused. Connections kept between requests keep no compute awake.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import httpx
import psycopg
import pytest

from tests.support import Api, Server, running_server, spend_refill, until_throttled, wait_for

OTHER = "127.0.0.2"
TIME_BOUND = 2.0
SIZE_BOUND = 1 << 20


@pytest.fixture(scope="module")
def bounded() -> Iterator[Server]:
    """A server whose SQL over HTTP has small bounds, so the walls are met quickly."""
    with running_server(
        PGPLANE_SQL_OVER_HTTP_TIMEOUT_SECONDS=str(TIME_BOUND),
        PGPLANE_SQL_OVER_HTTP_MAX_RESPONSE_BYTES=str(SIZE_BOUND),
    ) as srv:
        yield srv


@pytest.fixture
def bapi(bounded: Server) -> Iterator[Api]:
    _, key = bounded.create_key(f"walls-sql-{time.monotonic_ns()}@example.com")
    with Api(bounded, key) as client:
        yield client


def _uri(project: dict[str, Any], *, user: str | None = None, password: str | None = None) -> str:
    uri = project["connection_uris"][0]["connection_uri"]
    parts = urlsplit(uri)
    user = quote(user or parts.username or "", safe="")
    password = quote(password if password is not None else parts.password or "", safe="")
    return urlunsplit(parts._replace(netloc=f"{user}:{password}@{parts.hostname}"))


def _sql(
    server: Server,
    uri: str,
    body: Any,
    *,
    source: str = "127.0.0.1",
    headers: dict[str, str] | None = None,
    content: bytes | None = None,
) -> httpx.Response:
    transport = httpx.HTTPTransport(local_address=source)
    with httpx.Client(transport=transport, timeout=60) as client:
        return client.post(
            f"http://127.0.0.1:{server.proxy_port}/sql",
            headers={
                "Neon-Connection-String": uri,
                "Neon-Raw-Text-Output": "true",
                "Neon-Array-Mode": "true",
                "Content-Type": "text/plain;charset=UTF-8",
                **(headers or {}),
            },
            json=None if content is not None else body,
            content=content,
        )


def _starts(api: Api, pid: str) -> int:
    return sum(o["action"] == "start_compute" for o in api.operations(pid))


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_nothing_unauthenticated_wakes_a_compute(server: Server, api: Api) -> None:
    project = api.create_ready_project(name="walls-sql-wake")
    pid, eid = project["project"]["id"], project["endpoints"][0]["id"]
    with psycopg.connect(project["connection_uris"][0]["connection_uri"], autocommit=True) as c:
        c.execute("CREATE ROLE made_with_sql LOGIN PASSWORD 'its-own-password'")
    api.suspend(pid, eid)
    before = _starts(api, pid)

    for user, password in [
        (None, "wrong"),
        ("made_with_sql", "wrong"),
        ("nobody_made_me", "anything"),
        ("cloud_admin", "guess"),
    ]:
        r = _sql(server, _uri(project, user=user, password=password), {"query": "SELECT 1"})
        assert r.status_code == 400, r.text
        assert r.json()["code"] == "28P01", r.text
    assert _starts(api, pid) == before
    assert api.endpoint(pid, eid)["current_state"] == "idle"

    # The role made with SQL, with its password, wakes it and is in.
    r = _sql(
        server,
        _uri(project, user="made_with_sql", password="its-own-password"),
        {"query": "SELECT current_user"},
    )
    assert r.status_code == 200, r.text
    assert r.json()["rows"] == [["made_with_sql"]]
    assert _starts(api, pid) == before + 1


def test_another_accounts_endpoint_is_refused_as_one_that_does_not_exist(
    server: Server, api: Api, other_api: Api
) -> None:
    theirs = other_api.create_ready_project(name="walls-sql-theirs")
    their_pid, their_eid = theirs["project"]["id"], theirs["endpoints"][0]["id"]
    other_api.suspend(their_pid, their_eid)
    starts = _starts(other_api, their_pid)
    mine = api.create_ready_project(name="walls-sql-mine")
    my_eid = mine["endpoints"][0]["id"]
    answers = []
    for target in (their_eid, "ep-nothing-here-000000"):
        r = _sql(server, _uri(mine).replace(my_eid, target), {"query": "SELECT 1"})
        answers.append((r.status_code, r.json()))
    assert answers[0] == answers[1], answers
    assert answers[0][1]["code"] == "28P01"
    assert answers[0][1]["message"] == 'password authentication failed for user "neondb_owner"'
    assert "a mistyped one fails the same way" in answers[0][1]["hint"], answers[0][1]
    assert _starts(other_api, their_pid) == starts


def test_an_address_off_the_allow_list_is_refused_before_its_password(
    server: Server, api: Api
) -> None:
    project = api.create_ready_project(
        name="walls-sql-allow", settings={"allowed_ips": {"ips": ["127.0.0.1"]}}
    )
    pid, eid = project["project"]["id"], project["endpoints"][0]["id"]
    api.suspend(pid, eid)
    before = _starts(api, pid)
    for password in (None, "wrong"):
        r = _sql(server, _uri(project, password=password), {"query": "SELECT 1"}, source=OTHER)
        assert r.status_code == 400, r.text
        assert r.json()["code"] == "XX000"
        assert f"This IP address {OTHER} is not allowed" in r.json()["message"]
    assert _starts(api, pid) == before
    r = _sql(server, _uri(project), {"query": "SELECT 1"})
    assert r.status_code == 200, r.text


def test_wrong_passwords_are_throttled_per_endpoint_and_address(server: Server, api: Api) -> None:
    project = api.create_ready_project(name="walls-sql-throttle")
    wrong = _uri(project, password="wrong")

    def guess() -> dict[str, str]:
        answer: dict[str, str] = _sql(server, wrong, {"query": "SELECT 1"}).json()
        return answer

    def failed(answer: dict[str, str]) -> bool:
        return answer["code"] == "28P01"

    answers = [guess() for _ in range(30)]
    assert failed(answers[0])
    answer = until_throttled(guess, failed)
    assert answer["code"] == "08004", answer
    assert "too many failed logins" in answer["message"]

    # Now even the right password waits, from this address; another address is untouched.
    spend_refill(guess, failed)
    r = _sql(server, _uri(project), {"query": "SELECT 1"})
    assert r.status_code == 400 and "too many failed logins" in r.json()["message"]
    r = _sql(server, _uri(project), {"query": "SELECT 1"}, source=OTHER)
    assert r.status_code == 200, r.text


def test_a_query_that_never_ends_is_cancelled_on_the_compute(bounded: Server, bapi: Api) -> None:
    project = bapi.create_ready_project(name="walls-sql-forever")
    uri = _uri(project)
    started = time.monotonic()
    r = _sql(bounded, uri, {"query": "SELECT pg_sleep(3600)"})
    took = time.monotonic() - started
    assert r.status_code == 400, r.text
    assert r.json()["code"] == "57014" and "time limit" in r.json()["message"]
    assert TIME_BOUND <= took < TIME_BOUND + 10
    with psycopg.connect(project["connection_uris"][0]["connection_uri"]) as conn:
        running = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE query = 'SELECT pg_sleep(3600)'"
            " AND state = 'active'"
        ).fetchone()
    assert running == (0,)


def test_an_answer_past_the_size_bound_stops_there(bounded: Server, bapi: Api) -> None:
    project = bapi.create_ready_project(name="walls-sql-huge")
    uri = _uri(project)
    assert bounded.process is not None
    rss = _rss_kib(bounded.process.pid)
    for _ in range(3):
        r = _sql(bounded, uri, {"query": "SELECT repeat('x', 1000), generate_series(1, 1e8::int)"})
        assert r.status_code == 507, r.text
        assert "response is too large" in r.json()["message"]
    r = _sql(bounded, uri, {"query": "SELECT repeat('x', 10000000)"})
    assert r.status_code == 507, r.text
    # Each stopped at the bound: the server grew by far less than one answer would take.
    assert _rss_kib(bounded.process.pid) - rss < 64 * 1024
    r = _sql(bounded, uri, {"query": "SELECT 'still fine'"})
    assert r.json()["rows"] == [["still fine"]]


def test_bad_and_oversized_requests_are_refused(server: Server, api: Api) -> None:
    project = api.create_ready_project(name="walls-sql-bodies")
    uri = _uri(project)
    r = _sql(server, uri, None, content=b'{"query": "SELECT 1", "params": ["' + b"x" * (11 << 20))
    assert r.status_code == 413, r.text
    for content in (b"not json", b"[]", b'{"query": 7}'):
        r = _sql(server, uri, None, content=content)
        assert r.status_code == 400, r.text
        assert r.json()["message"]
    r = _sql(server, uri, {"query": "SELECT 1"}, headers={"Authorization": "Bearer x.y.z"})
    assert r.status_code == 400 and "token" in r.json()["message"]
    r = _sql(server, "postgresql://nobody@nowhere/db", {"query": "SELECT 1"})
    assert r.status_code == 400


def test_pooled_connections_do_not_keep_a_compute_awake(server: Server, api: Api) -> None:
    body = api.create_project(
        name="walls-sql-idle", default_endpoint_settings={"suspend_timeout_seconds": 2}
    )
    pid, eid = body["project"]["id"], body["endpoints"][0]["id"]
    api.wait_operations(pid, [o["id"] for o in body["operations"]])
    r = _sql(server, _uri(body), {"query": "SELECT 1"})
    assert r.status_code == 200, r.text
    # The proxy keeps the connection the request ran on; the compute suspends all the same.
    wait_for(
        "the idle compute suspended",
        lambda: api.endpoint(pid, eid)["current_state"] == "idle",
        timeout=60,
        server=server,
    )
    starts = _starts(api, pid)
    r = _sql(server, _uri(body), {"query": "SELECT 2"})
    assert (r.status_code, r.json()["rows"]) == (200, [["2"]])
    assert _starts(api, pid) == starts + 1


def test_a_strangers_body_is_never_read(server: Server, api: Api) -> None:
    """A body is read only once its sender is authenticated: a stranger's 9.8 MB of numbers
    (malformed at its very end, so a read of it would say so) is refused for its password,
    unread, and every other request is served as before."""
    project = api.create_ready_project(name="walls-sql-unread")
    numbers = b",".join(b"1" for _ in range(4_900_000))
    body = b'{"query": "SELECT $1", "params": [[' + numbers + b"]]"  # no closing brace
    r = _sql(server, _uri(project, password="not-the-password"), None, content=body)
    assert r.status_code == 400, r.text
    assert r.json()["code"] == "28P01", r.text  # the password, not the JSON
    r = _sql(server, _uri(project), None, content=body)
    assert r.status_code == 400 and "not valid JSON" in r.json()["message"], r.text
    r = _sql(server, _uri(project), {"query": "SELECT $1::int[]", "params": [[1, 2, 3]]})
    assert r.status_code == 200 and r.json()["rows"] == [["{1,2,3}"]], r.text
    # Not even received: the head says who sends it, and a stranger is answered from the head
    # alone, the connection closed, while its body has not started (it waited for the body,
    # 30 s, before: the event loop read every byte of it, for nothing).
    stranger = _uri(project, password="not-the-password")
    head = (
        "POST /sql HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
        f"Neon-Connection-String: {stranger}\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", server.proxy_port), timeout=20) as sock:
        sock.sendall(head.encode())
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    status, _, rest = answer.partition(b"\r\n")
    assert status == b"HTTP/1.1 400 Bad Request", answer
    assert b"Connection: close" in rest and b'"code":"28P01"' in rest.replace(b" ", b""), answer
