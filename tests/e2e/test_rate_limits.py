"""Rate limits (scenarios C6, I6(b), A7) on a server of their own with small limits.

30 requests a minute per account (one every 2 s once spent), bursts of 5 a second per route, 60
failed authentications a minute per address (one a second once spent). Counts are bounded by the
limits and the time the requests took, so a slow machine loosens a bound but never breaks a test.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterator

import httpx
import pytest

from pgplane.core import keys
from tests.console import Browser, signup_link
from tests.support import Api, Server, running_server

PER_MINUTE, BURST, FAILURES = 30, 5, 60
# Routes an account may call without an object of its own; six, so that the first 30 requests
# spread over them stay within each route's burst of 5 and only the account's limit is reached.
GET_ROUTES = ["/projects", "/api_keys", "/users/me", "/regions", "/auth", "/projects/shared"]
# The test client's other address: the whole of 127/8 is loopback, so a client bound to
# 127.0.0.2 reaches the server on 127.0.0.1 and is seen as another address.
ATTACKER = "127.0.0.2"

_accounts = itertools.count()


@pytest.fixture(scope="module")
def limited() -> Iterator[Server]:
    with running_server(
        PGPLANE_RATE_LIMIT_PER_MINUTE=str(PER_MINUTE),
        PGPLANE_RATE_LIMIT_BURST_PER_SECOND=str(BURST),
        PGPLANE_AUTH_FAILURES_PER_MINUTE=str(FAILURES),
    ) as srv:
        yield srv


def new_account(server: Server) -> str:
    return server.create_key(f"limited{next(_accounts)}@example.com")[1]


def assert_refused(r: httpx.Response) -> int:
    """A 429 with the error body and an integer ``Retry-After`` of at least 1; returns it."""
    assert r.status_code == 429, r.text
    assert r.headers["content-type"].startswith("application/json")
    body = r.json()
    assert set(body) == {"code", "message", "request_id"}
    assert body["code"] == "TOO_MANY_REQUESTS"
    retry_after = int(r.headers["retry-after"])
    assert retry_after >= 1
    return retry_after


def until_refused(
    send: Callable[[int], httpx.Response], cap: int = 1000
) -> tuple[list[int], httpx.Response, float]:
    """Send request 0, 1, … until one is refused: the statuses before it, the 429, seconds taken."""
    started = time.monotonic()
    statuses = []
    for i in range(cap):
        r = send(i)
        if r.status_code == 429:
            return statuses, r, time.monotonic() - started
        statuses.append(r.status_code)
    raise AssertionError(f"no 429 in {cap} requests")


def test_a_burst_on_one_route_is_refused_then_admitted_after_retry_after(
    limited: Server,
) -> None:
    with Api(limited, new_account(limited)) as client:
        statuses, refused, took = until_refused(lambda _: client.http.get("/projects"))
        assert statuses[:BURST] == [200] * BURST
        assert set(statuses) == {200}
        assert len(statuses) <= BURST + BURST * took + 1
        retry_after = assert_refused(refused)
        assert "second on this route" in refused.json()["message"]

        # Another route of the same account has a burst of its own.
        assert client.http.get("/api_keys").status_code == 200
        time.sleep(retry_after)
        assert client.http.get("/projects").status_code == 200


def test_an_accounts_keys_share_one_allowance_across_routes(limited: Server) -> None:
    first = new_account(limited)
    with Api(limited, first) as one:
        second = one.http.post("/api_keys", json={"key_name": "second"}).json()["key"]
        with Api(limited, second) as two:
            clients = [one, two]

            def send(i: int) -> httpx.Response:
                return clients[i % 2].http.get(GET_ROUTES[i % len(GET_ROUTES)])

            statuses, refused, took = until_refused(send)
            # The POST above was the account's first request: 29 are left at once.
            assert statuses[: PER_MINUTE - 1] == [200] * (PER_MINUTE - 1)
            assert set(statuses) == {200}
            # Keys limited one by one would have let through up to twice as many.
            assert len(statuses) + 1 <= PER_MINUTE + took * PER_MINUTE / 60 + 1
            retry_after = assert_refused(refused)
            assert retry_after <= 60 // PER_MINUTE
            assert "a minute" in refused.json()["message"]

            time.sleep(retry_after)
            assert send(len(statuses)).status_code == 200


def test_a_refused_request_changes_nothing(limited: Server) -> None:
    with Api(limited, new_account(limited)) as client:
        before = {k["id"] for k in client.http.get("/api_keys").json()}
        created = []

        def create(i: int) -> httpx.Response:
            r = client.http.post("/api_keys", json={"key_name": f"k{i}"})
            if r.status_code == 200:
                created.append(r.json()["id"])
            return r

        statuses, refused, _ = until_refused(create)
        assert set(statuses) == {200}
        time.sleep(assert_refused(refused))
        listed = {k["id"] for k in client.http.get("/api_keys").json()}
        assert listed == before | set(created)
        assert len(listed) == len(before) + len(statuses)


def test_one_accounts_burst_leaves_another_account_alone(limited: Server) -> None:
    """Scenario I6(b): while A is refused, B's paced requests all succeed."""
    a_key, b_key = new_account(limited), new_account(limited)
    stop, first_refusal = threading.Event(), threading.Event()
    a_statuses: list[int] = []

    def hammer() -> None:
        with Api(limited, a_key) as a:
            while not stop.is_set():
                status = a.http.get("/projects").status_code
                a_statuses.append(status)
                if status == 429:
                    first_refusal.set()

    threads = [threading.Thread(target=hammer) for _ in range(4)]
    for t in threads:
        t.start()
    try:
        assert first_refusal.wait(60)
        refused_before = a_statuses.count(429)
        b_statuses = []
        with Api(limited, b_key) as b:
            for _ in range(10):
                b_statuses.append(b.http.get("/projects").status_code)
                time.sleep(0.25)  # under 5 a second: B stays within its own limits
        refused_during = a_statuses.count(429) - refused_before
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert b_statuses == [200] * 10
    assert refused_during > 0  # A was being refused all the while
    assert set(a_statuses) == {200, 429}


def test_repeated_invalid_keys_from_one_address_are_throttled(limited: Server) -> None:
    """Scenario A7: after the threshold an address is refused, others are not, and it recovers."""
    valid = new_account(limited)
    attacker = httpx.Client(
        base_url=limited.base_url,
        transport=httpx.HTTPTransport(local_address=ATTACKER),
        timeout=30,
    )
    bystander = Api(limited, valid)
    wrong = [
        {},
        {"Authorization": "Bearer"},
        {"Authorization": "Basic dXNlcjpwYXNz"},
        {"Authorization": "Bearer not-a-key"},
    ]
    try:
        bodies = set()

        def guess(i: int) -> httpx.Response:
            # Mostly distinct well-formed keys that were never issued (each one looked up),
            # and every other wrong shape now and then.
            headers = (
                wrong[i // 4 % 4] if i % 4 == 0 else {"Authorization": f"Bearer {keys.generate()}"}
            )
            r = attacker.get("/projects", headers=headers)
            if r.status_code == 401:
                body = r.json()
                bodies.add((body["code"], body["message"], r.headers["www-authenticate"]))
            if i % 10 == 0:  # meanwhile a valid key from elsewhere is served
                assert bystander.http.get(GET_ROUTES[i // 10 % len(GET_ROUTES)]).status_code == 200
            return r

        statuses, refused, took = until_refused(guess)
        assert statuses[:FAILURES] == [401] * FAILURES
        assert set(statuses) == {401}  # no guess was ever accepted
        assert len(statuses) <= FAILURES + took * FAILURES / 60 + 1
        assert len(bodies) == 1
        retry_after = assert_refused(refused)
        assert "failed authentication" in refused.json()["message"]

        # While refused, the address gets no answer about any key, not even a valid one;
        # the same key from another address is served.
        auth = {"Authorization": f"Bearer {valid}"}
        assert_refused(attacker.get("/projects", headers=auth))
        assert bystander.http.get("/projects").status_code == 200

        time.sleep(retry_after)
        assert attacker.get("/projects", headers=auth).status_code == 200
    finally:
        attacker.close()
        bystander.http.close()


def test_console_pages_spend_the_accounts_allowance_with_its_keys() -> None:
    """A signed-in console's pages are an account's requests as its keys' are (each a few reads
    of the store): they were counted by no limit, so a session could ask without bound."""
    with (
        running_server(
            PGPLANE_RATE_LIMIT_PER_MINUTE=str(PER_MINUTE),
            PGPLANE_RATE_LIMIT_BURST_PER_SECOND="1000",
        ) as srv,
        Browser(srv) as browser,
    ):
        signed_up = browser.sign_up(signup_link(srv), "pages@example.com")
        assert signed_up.status_code in (302, 303), signed_up.text
        key = browser.create_key("beside the pages")
        statuses, refused, _ = until_refused(lambda _: browser.get("/console/projects"))
        assert len(statuses) <= PER_MINUTE and set(statuses) == {200}, statuses
        assert int(refused.headers["retry-after"]) >= 1
        with Api(srv, key) as api:  # the same account's key: the same allowance, spent
            assert_refused(api.http.get("/projects"))
