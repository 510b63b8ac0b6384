"""Account quotas on a real server: running computes and their compute units, through the API and
through the proxy's wake; each refusal is Neon's 422 (or a Postgres error) and changes nothing;
a raised quota lets the same request through; concurrent requests never overshoot.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import psycopg

from tests import pgclient
from tests.e2e.test_concurrency import at_once
from tests.support import Api, Server, running_server

ACTIVE = "ACTIVE_ENDPOINTS_LIMIT_EXCEEDED"
UNITS = "COMPUTE_UNITS_LIMIT_EXCEEDED"


def _refused(r: httpx.Response, code: str) -> str:
    """The message of a quota's refusal: 422, the error body, Neon's code for the quota."""
    assert r.status_code == 422, (r.status_code, r.text)
    body = r.json()
    assert set(body) == {"code", "message", "request_id"} and body["code"] == code, body
    return str(body["message"])


def _state(api: Api) -> dict[str, Any]:
    """What a refusal must not change: every project, with its branches, computes (and their
    states and sizes) and operations."""
    projects = api.http.get("/projects", params={"limit": 400}).json()["projects"]
    found = {}
    for p in projects:
        pid = p["id"]
        branches = api.http.get(f"/projects/{pid}/branches").json()["branches"]
        endpoints = api.http.get(f"/projects/{pid}/endpoints").json()["endpoints"]
        found[pid] = (
            sorted(b["id"] for b in branches),
            sorted(
                (e["id"], e["current_state"], e.get("pending_state"), e["autoscaling_limit_max_cu"])
                for e in endpoints
            ),
            [o["id"] for o in api.operations(pid)],
        )
    return found


def _ids(project: dict[str, Any]) -> tuple[str, str]:
    return project["project"]["id"], project["endpoints"][0]["id"]


def _restart(server: Server, **env: str) -> None:
    """The same platform, data and ports, with other settings."""
    server.stop()
    server.env.update(env)
    server.start()


def test_running_computes_quota_refuses_every_start_and_changes_nothing() -> None:
    with (
        running_server(
            PGPLANE_RUNNING_COMPUTES_PER_ACCOUNT="2", PGPLANE_COMPUTE_UNITS_PER_ACCOUNT="0"
        ) as srv,
        Api(srv, srv.create_key("runs@example.com")[1]) as api,
        Api(srv, srv.create_key("else@example.com")[1]) as other,
    ):
        first = api.create_ready_project(name="c1")
        second = api.create_ready_project(name="c2")
        pid, _ = _ids(first)
        before = _state(api)

        # A project comes with a compute that starts: it is refused whole.
        message = _refused(api.http.post("/projects", json={"project": {"name": "c3"}}), ACTIVE)
        assert "limit of 2" in message and "PGPLANE_RUNNING_COMPUTES_PER_ACCOUNT" in message
        with_compute = {"endpoints": [{"type": "read_write"}]}
        _refused(api.http.post(f"/projects/{pid}/branches", json=with_compute), ACTIVE)
        assert _state(api) == before
        other.create_ready_project(name="theirs")  # a quota is per account

        # A branch without a compute takes none; a compute made for it later is refused.
        bare = api.settled(pid, api.http.post(f"/projects/{pid}/branches", json={}))
        bare_id = bare["branch"]["id"]
        new_compute = {"endpoint": {"branch_id": bare_id, "type": "read_write"}}
        before = _state(api)
        _refused(api.http.post(f"/projects/{pid}/endpoints", json=new_compute), ACTIVE)
        assert _state(api) == before
        # Made disabled, it starts nothing and counts for nothing.
        disabled = {"endpoint": {**new_compute["endpoint"], "disabled": True}}
        made = api.http.post(f"/projects/{pid}/endpoints", json=disabled)
        assert made.status_code == 201 and made.json()["operations"] == [], made.text
        api.settled(
            pid, api.http.delete(f"/projects/{pid}/endpoints/{made.json()['endpoint']['id']}")
        )

        # A suspended compute frees its place; taken by another, starting it again is refused.
        second_pid, second_eid = _ids(second)
        api.suspend(second_pid, second_eid)
        api.settled(pid, api.http.post(f"/projects/{pid}/endpoints", json=new_compute))
        before = _state(api)
        for action in ("start", "restart"):
            url = f"/projects/{second_pid}/endpoints/{second_eid}/{action}"
            _refused(api.http.post(url), ACTIVE)
        assert _state(api) == before
        assert api.endpoint(second_pid, second_eid)["current_state"] == "idle"

        # A raised quota lets the same start through.
        _restart(srv, PGPLANE_RUNNING_COMPUTES_PER_ACCOUNT="3")
        api.settled(
            second_pid, api.http.post(f"/projects/{second_pid}/endpoints/{second_eid}/start")
        )
        assert api.endpoint(second_pid, second_eid)["current_state"] == "active"


def test_compute_units_quota_counts_the_running_computes_max_cu() -> None:
    with (
        running_server(
            PGPLANE_COMPUTE_UNITS_PER_ACCOUNT="1", PGPLANE_RUNNING_COMPUTES_PER_ACCOUNT="0"
        ) as srv,
        Api(srv, srv.create_key("units@example.com")[1]) as api,
    ):
        half = {"autoscaling_limit_min_cu": 0.25, "autoscaling_limit_max_cu": 0.5}
        first = api.create_ready_project(name="u1", default_endpoint_settings=half)
        api.create_ready_project(name="u2", default_endpoint_settings=half)  # 1 CU: the limit
        pid, eid = _ids(first)
        before = _state(api)

        message = _refused(api.http.post("/projects", json={"project": {"name": "u3"}}), UNITS)
        assert "limit of 1 CU" in message and "1.25 CU" in message
        # Growing a running compute is refused as starting a bigger one is.
        grow = {"endpoint": {"autoscaling_limit_max_cu": 0.75}}
        _refused(api.http.patch(f"/projects/{pid}/endpoints/{eid}", json=grow), UNITS)
        assert _state(api) == before

        # A suspended compute may grow (it is checked when it starts again)...
        api.suspend(pid, eid)
        api.settled(pid, api.http.patch(f"/projects/{pid}/endpoints/{eid}", json=grow))
        # ... and then does not fit beside the other: 1.25 CU.
        before = _state(api)
        _refused(api.http.post(f"/projects/{pid}/endpoints/{eid}/start"), UNITS)
        assert _state(api) == before

        # Shrunk, it starts; a raised quota takes a project more.
        shrink = {"endpoint": {"autoscaling_limit_max_cu": 0.5}}
        api.settled(pid, api.http.patch(f"/projects/{pid}/endpoints/{eid}", json=shrink))
        api.settled(pid, api.http.post(f"/projects/{pid}/endpoints/{eid}/start"))
        _restart(srv, PGPLANE_COMPUTE_UNITS_PER_ACCOUNT="1.25")
        api.create_ready_project(name="u3")


def test_concurrent_requests_never_overshoot_a_quota() -> None:
    """Eight creations at once, each from its own connection, for the last places: exactly as
    many as fit are made, the rest refused."""
    with (
        running_server(
            PGPLANE_RUNNING_COMPUTES_PER_ACCOUNT="2",
            PGPLANE_PROJECTS_PER_ACCOUNT="0",
            PGPLANE_COMPUTE_UNITS_PER_ACCOUNT="0",
        ) as srv,
        Api(srv, srv.create_key("races@example.com")[1]) as api,
    ):
        creations = [("POST", "/projects", {"project": {"name": f"race-{i}"}}) for i in range(8)]
        answers = at_once(api, creations)
        assert sorted(r.status_code for r in answers) == [201] * 2 + [422] * 6
        assert {r.json()["code"] for r in answers if r.status_code == 422} == {ACTIVE}
        made = [r.json() for r in answers if r.status_code == 201]
        assert len(_state(api)) == 2

        # The projects quota too: one place left of three.
        for body in made:
            api.wait_operations(body["project"]["id"], [o["id"] for o in body["operations"]])
        _restart(srv, PGPLANE_RUNNING_COMPUTES_PER_ACCOUNT="0", PGPLANE_PROJECTS_PER_ACCOUNT="3")
        answers = at_once(api, creations)
        assert sorted(r.status_code for r in answers) == [201] + [422] * 7
        assert {r.json()["code"] for r in answers if r.status_code == 422} == {
            "PROJECTS_LIMIT_EXCEEDED"
        }
        assert len(_state(api)) == 3


def test_a_wake_past_the_quota_is_a_postgres_error_and_starts_nothing() -> None:
    with (
        running_server(PGPLANE_RUNNING_COMPUTES_PER_ACCOUNT="1") as srv,
        Api(srv, srv.create_key("wakes@example.com")[1]) as api,
    ):
        projects = []
        for name in ("w1", "w2"):  # each suspended before the next may start its compute
            made = api.create_ready_project(name=name)
            api.suspend(*_ids(made))
            projects.append(made)
        uris = [p["connection_uris"][0]["connection_uri"] for p in projects]

        # Two connections at once to two suspended computes, one place: one wakes its compute.
        def connect(uri: str) -> str | None:
            try:
                with psycopg.connect(uri, connect_timeout=60) as conn:
                    conn.execute("select 1")
            except psycopg.OperationalError as exc:
                return str(exc)
            return None

        with ThreadPoolExecutor(2) as pool:
            outcomes = list(pool.map(connect, uris))
        assert sorted(o is None for o in outcomes) == [False, True], outcomes
        refused = next(o for o in outcomes if o is not None)
        assert "cannot be started" in refused and "active endpoints limit exceeded" in refused
        waiting = projects[outcomes.index(refused)]
        pid, eid = _ids(waiting)
        before = _state(api)

        # Again, read off the wire: after the password, SQLSTATE 53400, and nothing starts.
        password = waiting["connection_uris"][0]["connection_parameters"]["password"]
        login = pgclient.after_login(
            srv.proxy_port, endpoint=eid, user="neondb_owner", password=password
        )
        assert login.code == "53400" and "limit of 1" in (login.error or ""), login
        assert _state(api) == before
        assert not list(srv.data_dir.glob(f"projects/{pid}/branches/*/pgdata/postmaster.pid"))

        # Once the other compute is suspended, the same connection wakes this one.
        running = projects[1 - outcomes.index(refused)]
        api.suspend(*_ids(running))
        assert connect(waiting["connection_uris"][0]["connection_uri"]) is None
        assert api.endpoint(pid, eid)["current_state"] == "active"
