"""Quotas and rate limits with two nodes on one PostgreSQL store.

Quotas are counted in the store, in the write transaction that would pass them (one writer at a
time over every node): requests raced through both nodes for the last places never overshoot,
and the computes an account runs count on whichever node they run. Rate limits are each node's
own (api/ratelimit.py, README "Several nodes…"): an account that spent its allowance on node A
is refused there while node B admits its own, so over N nodes it gets at most N times the
limits, and no more; so does an address that failed to authenticate.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.e2e.test_rate_limits import ATTACKER, assert_refused, until_refused
from tests.nodes import home, node_of, running_nodes
from tests.support import Api, Server

PER_MINUTE, FAILURES = 6, 6  # one more each every 10 s: the test is done long before
RATE_LIMITS = {
    "PGPLANE_RATE_LIMIT_PER_MINUTE": str(PER_MINUTE),
    "PGPLANE_RATE_LIMIT_BURST_PER_SECOND": "0",
    "PGPLANE_AUTH_FAILURES_PER_MINUTE": str(FAILURES),
}
QUOTAS = {  # and no rate limits: the test polls its operations
    "PGPLANE_PROJECTS_PER_ACCOUNT": "3",
    "PGPLANE_RUNNING_COMPUTES_PER_ACCOUNT": "3",
    "PGPLANE_COMPUTE_UNITS_PER_ACCOUNT": "0",
}


@pytest.fixture(scope="module")
def limited() -> Iterator[tuple[Server, Server]]:
    with running_nodes(2, **RATE_LIMITS) as servers:
        yield servers[0], servers[1]


def _across(servers: tuple[Server, Server], key: str, count: int) -> list[httpx.Response]:
    """``count`` project creations at once, alternately through each node, each from its own
    connection (connected before the start)."""
    barrier = threading.Barrier(count)

    def send(i: int) -> httpx.Response:
        with httpx.Client(
            base_url=servers[i % 2].base_url,
            headers={"Authorization": f"Bearer {key}"},
            timeout=60,
        ) as http:
            http.get("/users/me")
            barrier.wait()
            return http.post("/projects", json={"project": {"name": f"race-{i}"}})

    with ThreadPoolExecutor(count) as pool:
        return list(pool.map(send, range(count)))


def test_quotas_raced_through_both_nodes_never_overshoot() -> None:
    with running_nodes(2, **QUOTAS) as servers:
        _raced(servers[0], servers[1])


def _raced(a: Server, b: Server) -> None:
    pair = (a, b)
    _, key = a.create_key("quota@example.com")
    answers = _across(pair, key, 8)
    assert sorted(r.status_code for r in answers) == [201] * 3 + [422] * 5, [
        r.text for r in answers
    ]
    assert {r.json()["code"] for r in answers if r.status_code == 422} == {
        "PROJECTS_LIMIT_EXCEEDED"
    }
    made = [r.json() for r in answers if r.status_code == 201]
    with Api(a, key) as on_a, Api(b, key) as on_b:
        for body in made:
            pid = body["project"]["id"]
            on_a.wait_operations(pid, [o["id"] for o in body["operations"]], 120)
        for api in (on_a, on_b):
            assert len(api.http.get("/projects").json()["projects"]) == 3
        # Placed on both nodes, and the account's three computes run there: a fourth is refused
        # through either node, whichever node it would run on.
        homes = {pid: home(pair, pid) for pid in (p["project"]["id"] for p in made)}
        assert {node_of(s) for s in homes.values()} == {"node-a", "node-b"}
        for api in (on_a, on_b):
            for pid in homes:
                r = api.http.post(
                    f"/projects/{pid}/branches",
                    json={"branch": {"name": "more"}, "endpoints": [{"type": "read_write"}]},
                )
                assert r.status_code == 422, r.text
                assert r.json()["code"] == "ACTIVE_ENDPOINTS_LIMIT_EXCEEDED"
        # One suspended on node A's side frees a place on node B's.
        on_a_pid = next(pid for pid, where in homes.items() if where is a)
        on_b_pid = next(pid for pid, where in homes.items() if where is b)
        eid = next(p["endpoints"][0]["id"] for p in made if p["project"]["id"] == on_a_pid)
        on_b.suspend(on_a_pid, eid)
        r = on_a.http.post(
            f"/projects/{on_b_pid}/branches",
            json={"branch": {"name": "freed"}, "endpoints": [{"type": "read_write"}]},
        )
        on_a.settled(on_b_pid, r)


def test_an_accounts_rate_limit_is_each_nodes_own(limited: tuple[Server, Server]) -> None:
    a, b = limited
    _, key = a.create_key("rate@example.com")
    with Api(a, key) as on_a, Api(b, key) as on_b:
        started = time.monotonic()
        counted = []
        for api in (on_a, on_b):
            statuses, refused, took = until_refused(lambda _, api=api: api.http.get("/projects"))
            assert set(statuses) == {200}
            # Each node admits the account's whole allowance (and what refilled meanwhile) ...
            assert PER_MINUTE <= len(statuses) <= PER_MINUTE + took * PER_MINUTE / 60 + 1
            assert "a minute" in refused.json()["message"]
            assert_refused(refused)
            counted.append(len(statuses))
        # ... and no more than that: over both, at most twice the limit in the time it took.
        elapsed = time.monotonic() - started
        assert sum(counted) <= 2 * (PER_MINUTE + elapsed * PER_MINUTE / 60 + 1)
        # Node A still refuses: node B's allowance was B's own.
        assert_refused(on_a.http.get("/projects"))


def test_failed_authentications_are_counted_by_each_node(
    limited: tuple[Server, Server],
) -> None:
    a, b = limited
    _, key = a.create_key("guesser@example.com")
    good = {"Authorization": f"Bearer {key}"}
    with (
        httpx.Client(
            base_url=a.base_url,
            transport=httpx.HTTPTransport(local_address=ATTACKER),
            timeout=30,
        ) as at_a,
        httpx.Client(
            base_url=b.base_url,
            transport=httpx.HTTPTransport(local_address=ATTACKER),
            timeout=30,
        ) as at_b,
    ):
        for client in (at_a, at_b):
            statuses, refused, took = until_refused(
                lambda _, c=client: c.get("/projects", headers={"Authorization": "Bearer nope"})
            )
            assert set(statuses) == {401}
            assert FAILURES <= len(statuses) <= FAILURES + took * FAILURES / 60 + 1
            assert_refused(refused)
            # Refused on this node even with a valid key, until it may fail again ...
            assert_refused(client.get("/projects", headers=good))
            if client is at_a:  # ... while the other node has counted none of it
                assert at_b.get("/projects", headers=good).status_code == 200
