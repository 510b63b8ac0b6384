"""The console's branch and data forms over HTTP: a new branch's data (its parent's, at a time,
or its schema only), its expiry, read-only computes, and snapshots with backup schedules. Each
form does what the API's route does (checked through the API); bad input is a 400 page that
names the field and changes nothing. Isolation from other accounts is test_console.py's matrix.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from tests.console import PASSWORD, Browser
from tests.support import Api, Server, run_cli, running_server


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    with running_server() as srv:
        yield srv


def _signed_in(server: Server, email: str) -> Browser:
    done = run_cli(
        "accounts", "create", email, "--password-stdin", data_dir=server.data_dir, stdin=PASSWORD
    )
    assert done.returncode == 0, done.stderr
    browser = Browser(server)
    assert browser.sign_in(email).status_code == 303
    return browser


@contextlib.contextmanager
def _session(server: Server, email: str) -> Iterator[tuple[Browser, Api]]:
    """A new account, signed in to the console, and its API through a key made there."""
    with _signed_in(server, email) as browser, Api(server, browser.create_key("k")) as api:
        yield browser, api


def _settle(api: Api, pid: str) -> None:
    """Every operation of the project, settled and finished."""
    ops = api.wait_operations(pid, [o["id"] for o in api.operations(pid)], timeout=120)
    assert all(o["status"] == "finished" for o in ops), ops


def _branches(api: Api, pid: str) -> list[dict[str, object]]:
    found: list[dict[str, object]] = api.http.get(f"/projects/{pid}/branches").json()["branches"]
    return found


def test_a_new_branch_starts_from_the_parents_data_its_history_or_its_schema_only(
    server: Server,
) -> None:
    with _session(server, "data@example.com") as (browser, api):
        body = api.create_ready_project(name="sources")
        pid, main = body["project"]["id"], body["branch"]["id"]
        project = f"/console/projects/{pid}"
        page = browser.get(f"{project}?branch={main}").text
        assert 'name="init_source"' in page and 'name="parent_timestamp"' in page
        before = sorted(str(b["id"]) for b in _branches(api, pid))
        bad = [
            ({"init_source": "rows-only"}, "init_source"),
            ({"parent_timestamp": "yesterday"}, "parent_timestamp"),
            ({"parent_timestamp": "2026-11-25T09:00:00"}, "time zone"),
            ({"parent_timestamp": "2999-01-01T00:00:00Z"}, "is in the future"),
            ({"parent_timestamp": "2000-01-01T00:00:00Z", "init_source": "schema-only"},
             "before branch"),
        ]  # fmt: skip
        for fields, said in bad:
            r = browser.post(f"{project}/branches", name="bad", parent_id=main, **fields)
            assert r.status_code == 400 and said in r.text, (fields, r.text[:400])
            assert "parent_timestamp" in r.text or "init_source" in r.text
        assert sorted(str(b["id"]) for b in _branches(api, pid)) == before

        r = browser.post(
            f"{project}/branches", name="shape", parent_id=main, init_source="schema-only"
        )
        assert r.status_code == 303, r.text[:300]
        made = next(b for b in _branches(api, pid) if b["name"] == "shape")
        assert made["init_source"] == "schema-only" and made.get("parent_id") is None
        assert 'data-testid="schema-only"' in browser.get(r.headers["location"]).text

        at = datetime.now(UTC).isoformat()  # after the project's data was made
        r = browser.post(f"{project}/branches", name="then", parent_id=main, parent_timestamp=at)
        assert r.status_code == 303, r.text[:300]
        then = next(b for b in _branches(api, pid) if b["name"] == "then")
        assert then["parent_id"] == main and then["init_source"] == "parent-data"
        assert str(then["parent_timestamp"])[:19] == at[:19]
        _settle(api, pid)


def test_read_only_computes_are_added_and_computes_deleted(server: Server) -> None:
    with _session(server, "replicas@example.com") as (browser, api):
        body = api.create_ready_project(name="replicas")
        pid, main = body["project"]["id"], body["branch"]["id"]
        primary = body["endpoints"][0]["id"]
        project = f"/console/projects/{pid}"
        page = browser.get(f"{project}?branch={main}").text
        assert "Add read-only compute" in page and "Add read-write compute" not in page

        def computes() -> list[tuple[str, str]]:
            found = api.http.get(f"/projects/{pid}/branches/{main}/endpoints").json()
            return sorted((e["type"], e["id"]) for e in found["endpoints"])

        for kind in ("reader", "", "read_write "):
            r = browser.post(f"{project}/branches/{main}/endpoints", type=kind)
            assert r.status_code == 400 and "type must be" in r.text, r.text[:300]
        assert computes() == [("read_write", primary)]
        r = browser.post(f"{project}/branches/{main}/endpoints", type="read_only")
        assert r.status_code == 303, r.text[:300]
        (kind, replica), _ = computes()
        assert kind == "read_only"
        page = browser.get(f"{project}?branch={main}").text
        assert f'data-endpoint="{replica}"' in page and "read-only</span>" in page
        _settle(api, pid)

        assert browser.post(f"{project}/endpoints/{replica}/delete").status_code == 303
        assert browser.post(f"{project}/endpoints/{primary}/delete").status_code == 303
        assert computes() == []
        page = browser.get(f"{project}?branch={main}").text
        assert "This branch has no compute." in page and "Add read-write compute" in page
        r = browser.post(f"{project}/branches/{main}/endpoints", type="read_only")
        assert r.status_code == 303  # a branch without a read-write compute may have one
        assert [k for k, _ in computes()] == ["read_only"]
        _settle(api, pid)


def test_snapshots_are_taken_renamed_restored_and_deleted_and_scheduled(server: Server) -> None:
    with _session(server, "snapshots@example.com") as (browser, api):
        body = api.create_ready_project(name="kept")
        pid, main = body["project"]["id"], body["branch"]["id"]
        project = f"/console/projects/{pid}"
        snapshots_page = f"{project}/snapshots?branch={main}"
        assert "No snapshots yet." in browser.get(snapshots_page).text

        def listed() -> list[dict[str, object]]:
            found: list[dict[str, object]] = api.http.get(f"/projects/{pid}/snapshots").json()[
                "snapshots"
            ]
            return found

        for fields, said in (
            ({"timestamp": "noon"}, "timestamp must be an RFC 3339 time"),
            ({"timestamp": "2999-01-01T00:00:00Z"}, "timestamp 2999-01-01T00:00:00Z is in"),
            ({"name": "x" * 300}, "snapshot name must be at most"),
            ({"expires_in": "60"}, "expires_in: choose one of the offered times"),
        ):
            r = browser.post(f"{project}/branches/{main}/snapshot", **fields)
            assert r.status_code == 400 and said in r.text, (fields, r.text[:400])
        assert listed() == []

        made = time.time()
        r = browser.post(
            f"{project}/branches/{main}/snapshot", name="before-migration", expires_in="604800"
        )
        assert r.status_code == 303 and r.headers["location"].endswith(snapshots_page)
        (snap,) = listed()
        assert snap["name"] == "before-migration" and snap["manual"] is True
        expires = datetime.fromisoformat(str(snap["expires_at"])).timestamp()
        assert made + 604_800 - 2 <= expires <= time.time() + 604_800 + 1
        sid = str(snap["id"])
        _settle(api, pid)
        page = browser.get(snapshots_page).text
        assert f'data-snapshot="{sid}"' in page and "by hand" in page
        assert "Restore into a new branch" in page and "Restore onto main" in page

        r = browser.post(f"{project}/snapshots/{sid}/rename", name=" ")
        assert r.status_code == 400 and "snapshot name must not be empty" in r.text
        assert browser.post(f"{project}/snapshots/{sid}/rename", name="v1").status_code == 303
        assert [s["name"] for s in listed()] == ["v1"]
        r = browser.post(f"{project}/snapshots/{sid}/expiry", expires_in="forever")
        assert r.status_code == 400 and "expires_in" in r.text
        assert listed()[0]["expires_at"] == snap["expires_at"]
        assert browser.post(f"{project}/snapshots/{sid}/expiry", expires_in="").status_code == 303
        assert listed()[0].get("expires_at") is None  # kept until deleted, as a PATCH with null
        assert browser.post(f"{project}/snapshots/{sid}/forget").status_code == 404

        r = browser.post(f"{project}/snapshots/{sid}/restore", name="recovered")
        assert r.status_code == 303, r.text[:300]
        recovered = next(b for b in _branches(api, pid) if b["name"] == "recovered")
        assert r.headers["location"].endswith(f"?branch={recovered['id']}")
        assert recovered["parent_id"] == main

        r = browser.post(f"{project}/snapshots/{sid}/finalize", target_branch_id=main)
        assert r.status_code == 303, r.text[:300]
        (now_main,) = [b for b in _branches(api, pid) if b["name"] == "main"]
        assert r.headers["location"].endswith(f"?branch={now_main['id']}")
        assert now_main["id"] != main and now_main["restore_status"] == "finalized"
        assert {str(b["name"]) for b in _branches(api, pid) if b["id"] == main} == {"main (old)"}
        _settle(api, pid)

        assert browser.post(f"{project}/snapshots/{sid}/delete").status_code == 303
        assert listed() == []
        _settle(api, pid)


def test_a_branchs_backup_schedule_is_shown_and_replaced(server: Server) -> None:
    with _session(server, "schedule@example.com") as (browser, api):
        body = api.create_project(name="scheduled")
        pid, main = body["project"]["id"], body["branch"]["id"]
        project = f"/console/projects/{pid}"
        path = f"{project}/branches/{main}/backup_schedule"

        def schedule() -> object:
            return api.http.get(f"/projects/{pid}/branches/{main}/backup_schedule").json()

        assert "No scheduled snapshots." in browser.get(f"{project}/snapshots").text
        r = browser.post(path, daily="1", daily_hour="3", daily_retention_days="7",
                         weekly="1", weekly_day="7", weekly_hour="22")  # fmt: skip
        assert r.status_code == 303, r.text[:300]
        assert schedule() == {
            "schedule": [
                {"frequency": "daily", "hour": 3, "retention_seconds": 604_800},
                {"frequency": "weekly", "day": 7, "hour": 22, "retention_seconds": 3_024_000},
            ]
        }
        page = browser.get(f"{project}/snapshots?branch={main}").text
        assert (
            "Daily at 03:00 UTC, kept 7 days; Weekly on Sunday at 22:00 UTC, kept 35 days" in page
        )
        before = schedule()
        for fields, field in (
            ({"daily": "1", "daily_hour": "24"}, "daily_hour"),
            ({"weekly": "1", "weekly_day": "8"}, "weekly_day"),
            ({"monthly": "1", "monthly_day": "0"}, "monthly_day"),
            ({"monthly": "1", "monthly_retention_days": "36"}, "monthly_retention_days"),
            ({"daily": "1", "daily_hour": "-1"}, "daily_hour"),
        ):
            r = browser.post(path, **fields)
            assert r.status_code == 400 and f"{field} must be a whole number" in r.text, fields
        assert schedule() == before
        assert browser.post(path).status_code == 303  # nothing ticked: no schedule
        assert schedule() == {"schedule": []}
        # One the API set, in hours: shown as it is.
        monthly = {"frequency": "monthly", "day": 31, "hour": 1, "retention_seconds": 7200}
        r = api.http.put(
            f"/projects/{pid}/branches/{main}/backup_schedule", json={"schedule": [monthly]}
        )
        assert r.status_code == 200, r.text
        page = browser.get(f"{project}/snapshots?branch={main}").text
        assert "Monthly on day 31 at 01:00 UTC, kept 2 hours" in page


def test_a_branch_made_in_the_console_is_deleted_after_a_day_unless_kept(server: Server) -> None:
    """As Neon's console: a new branch expires in a day by default; the page says when, shows
    the branch's annotations, lets the user keep it or choose another time, and says why a
    branch that cannot expire will not (the API's rules, services/expiry.py)."""
    with _signed_in(server, "expiry@example.com") as browser:
        key = browser.create_key("expiry")
        with Api(server, key) as api:
            body = api.create_project(name="previews")
            pid, main = body["project"]["id"], body["branch"]["id"]
            project = f"/console/projects/{pid}"
            page = browser.get(f"{project}?branch={main}").text
            assert 'data-testid="expiry-kept"' in page and "default branch" in page
            assert '<option value="86400" selected>in 1 day</option>' in page

            made = time.time()
            r = browser.post(f"{project}/branches", name="pr-7", parent_id=main, expires_in="86400")
            assert r.status_code == 303, r.text[:300]
            child = api.http.get(f"/projects/{pid}/branches", params={"search": "pr-7"}).json()
            branch = child["branches"][0]
            expires = datetime.fromisoformat(branch["expires_at"]).timestamp()
            assert made + 86_400 - 2 <= expires <= time.time() + 86_400 + 1
            assert branch["ttl_interval_seconds"] in range(86_398, 86_402)

            bid = branch["id"]
            api.http.patch(
                f"/projects/{pid}/branches/{bid}",
                json={"branch": {}, "annotation_value": {"github-pr-number": "7"}},
            ).raise_for_status()
            page = browser.get(f"{project}?branch={bid}").text
            assert 'data-testid="expires"' in page and "github-pr-number: 7" in page
            # What is left, not a date that reads as the past ("deleted at <tomorrow>").
            assert ">expires in 23 hours</span>" in page, page
            assert "Expires in 23 hours: deleted with its computes and data at" in page

            # A value the form does not offer: a 400 naming the field, and nothing changes.
            r = browser.post(f"{project}/branches/{bid}/expiry", expires_in="99999999")
            assert r.status_code == 400 and "expires_in" in r.text
            assert _branch(api, pid, bid)["expires_at"] == branch["expires_at"]
            # Kept: the expiry is cleared, as a PATCH with null clears it.
            r = browser.post(f"{project}/branches/{bid}/expiry", expires_in="")
            assert r.status_code == 303
            kept = _branch(api, pid, bid)
            assert kept.get("expires_at") is None and kept.get("ttl_interval_seconds") is None
            assert "Kept until you delete it." in browser.get(f"{project}?branch={bid}").text
            r = browser.post(f"{project}/branches/{bid}/expiry", expires_in="3600")
            assert r.status_code == 303
            assert _branch(api, pid, bid)["ttl_interval_seconds"] in range(3598, 3602)


def _branch(api: Api, pid: str, bid: str) -> dict[str, object]:
    r = api.http.get(f"/projects/{pid}/branches/{bid}")
    r.raise_for_status()
    branch: dict[str, object] = r.json()["branch"]
    return branch
