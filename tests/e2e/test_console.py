"""The web console over HTTP, as a browser speaks to it: the first account from the link ``serve``
prints, API keys, and the console's security (CSRF, login CSRF, forms posted from other origins,
framing and caching headers, session fixation, sign-out, throttled sign-in, one account never
reaching another's objects). The browser-driven first hour is test_console_browser.py.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import httpx
import pytest

from tests.console import PASSWORD, Browser, root, signup_link
from tests.support import Api, Server, run_cli, running_server, wait_for


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    with running_server() as srv:
        yield srv


def _account(server: Server, email: str) -> None:
    done = run_cli(
        "accounts", "create", email, "--password-stdin", data_dir=server.data_dir, stdin=PASSWORD
    )
    assert done.returncode == 0, done.stderr


def _signed_in(server: Server, email: str) -> Browser:
    browser = Browser(server)
    r = browser.sign_in(email)
    assert r.status_code == 303, r.text
    return browser


def test_the_first_account_comes_from_the_link_serve_printed_and_the_link_works_once(
    server: Server,
) -> None:
    link = signup_link(server)
    with Browser(server) as first, Browser(server) as second:
        r = first.sign_up(link, "founder@example.com")
        assert r.status_code == 303 and r.headers["location"] == "/console/projects", r.text
        assert first.get("/console/projects").status_code == 200
        # Used: it says so when opened, before its form is filled in (and refuses the form).
        r = second.get(link.removeprefix(root(server)))
        assert r.status_code == 401 and "it was used" in r.text, r.text
        r = second.sign_up(link, "intruder@example.com")
        assert r.status_code == 401 and "not valid" in r.text
        assert second.session is None
        assert second.sign_in("intruder@example.com").status_code == 401


def test_an_invitation_is_for_its_email_only(server: Server) -> None:
    done = run_cli("accounts", "invite", "guest@example.com", data_dir=server.data_dir)
    assert done.returncode == 0, done.stderr
    # Where this server serves its console, without --url: serve noted it.
    link = done.stdout.strip()
    assert link.startswith(f"http://127.0.0.1:{server.port}/console/signup?token="), link
    with Browser(server) as other, Browser(server) as guest:
        r = other.sign_up(link, "someone-else@example.com")
        assert r.status_code == 400 and "guest@example.com" in r.text
        # The refused attempt changed nothing; the link works once, for its email.
        assert guest.sign_up(link, "guest@example.com").status_code == 303
        assert other.sign_up(link, "guest@example.com").status_code == 401


def test_keys_made_in_the_console_work_on_the_api_until_revoked(server: Server) -> None:
    _account(server, "keys@example.com")
    with _signed_in(server, "keys@example.com") as browser:
        key = browser.create_key("first")
        listed = browser.get("/console/settings/api-keys/").text
        assert "first" in listed and key not in listed  # shown once, never again
        with Api(server, key) as api:
            assert api.http.get("/projects").status_code == 200
            key_id = api.http.get("/api_keys").json()[0]["id"]
            wait_for(  # last used, and from where (uses are written every few seconds)
                "the key's use shown",
                lambda: "127.0.0.1" in browser.get("/console/settings/api-keys/").text,
            )
            r = browser.post(f"/console/settings/api-keys/{key_id}/revoke")
            assert r.status_code == 303
            assert api.http.get("/projects").status_code == 401


def test_a_form_without_the_session_csrf_token_changes_nothing(server: Server) -> None:
    _account(server, "csrf@example.com")
    _account(server, "csrf-other@example.com")
    with (
        _signed_in(server, "csrf@example.com") as victim,
        _signed_in(server, "csrf-other@example.com") as attacker,
    ):
        victim.get("/console/projects/")
        attacker.get("/console/projects/")
        for token in ("", attacker.csrf, "forged"):
            r = victim.post("/console/settings/api-keys/", csrf=token, name="planted")
            assert r.status_code == 403, r.text
            r = victim.post("/console/projects/", csrf=token, name="planted")
            assert r.status_code == 403
            r = victim.post("/console/signout", csrf=token)
            assert r.status_code == 403
        page = victim.get("/console/settings/api-keys/").text
        assert "planted" not in page
        assert "planted" not in victim.get("/console/projects/").text
        assert victim.get("/console/projects/").status_code == 200  # still signed in
        # The sign-in form has a token of its own (its pre-session's): a form posted from
        # elsewhere cannot sign a victim in to the attacker's account.
        with Browser(server) as fresh:
            r = fresh.post("/console/signin", csrf="", email="csrf@example.com", password=PASSWORD)
            assert r.status_code == 403 and fresh.session is None


def _set_form_cookie(browser: Browser, value: str) -> None:
    browser.http.cookies.set("pgplane_form", value, domain="127.0.0.1", path="/console")


def test_the_sign_in_forms_take_only_the_token_the_server_issued_to_that_browser(
    server: Server,
) -> None:
    """Login CSRF: a sibling origin that can set this host's cookies could make a double-submit
    cookie and its form agree, and sign a victim's browser in to the attacker's account."""
    _account(server, "login-csrf@example.com")
    sign_in = {"email": "login-csrf@example.com", "password": PASSWORD}
    with Browser(server) as victim:  # a cookie and token the server never issued
        _set_form_cookie(victim, "chosen-by-the-attacker")
        r = victim.post("/console/signin", csrf="chosen-by-the-attacker", **sign_in)
        assert r.status_code == 403 and victim.session is None, r.text
        r = victim.post(
            "/console/signup", csrf="chosen-by-the-attacker", token="x", email="x@example.com"
        )
        assert r.status_code == 403 and "did not come from this console" in r.text
    with Browser(server) as attacker, Browser(server) as victim:
        attacker.get("/console/signin")
        victim.get("/console/signin")
        assert attacker.csrf and victim.csrf and attacker.csrf != victim.csrf
        # One pre-session's token under another's cookie.
        r = victim.post("/console/signin", csrf=attacker.csrf, **sign_in)
        assert r.status_code == 403 and victim.session is None
        spent_cookie, spent_token = victim.http.cookies["pgplane_form"], victim.csrf
        assert victim.post("/console/signin", **sign_in).status_code == 303  # its own works
        assert victim.session is not None
    with Browser(server) as replay:  # a signed-in pre-session's token is spent
        _set_form_cookie(replay, spent_cookie)
        r = replay.post("/console/signin", csrf=spent_token, **sign_in)
        assert r.status_code == 403 and replay.session is None


def test_a_form_posted_from_another_origin_changes_nothing(server: Server) -> None:
    _account(server, "origin@example.com")
    sign_in = {"email": "origin@example.com", "password": PASSWORD}
    foreign = [
        {"Origin": "http://evil.localhost"},
        {"Origin": "null"},
        {"Origin": "http://127.0.0.1:1"},  # a sibling: another port of the same host
        {"Origin": f"http://localhost:{server.port}"},
        {"Sec-Fetch-Site": "same-site"},
        {"Sec-Fetch-Site": "cross-site"},
    ]
    with _signed_in(server, "origin@example.com") as browser, Browser(server) as fresh:
        browser.get("/console/settings/api-keys/")
        for headers in foreign:
            r = browser.post("/console/settings/api-keys/", headers=headers, name="planted")
            assert r.status_code == 403, (headers, r.status_code)
            assert "did not come from this console" in r.text  # the console's error page
            assert r.headers["content-type"].startswith("text/html")
            fresh.get("/console/signin")
            r = fresh.post("/console/signin", headers=headers, **sign_in)
            assert r.status_code == 403 and fresh.session is None, headers
        assert "planted" not in browser.get("/console/settings/api-keys/").text
        # The console's own origin, as a browser sends it, is not refused.
        own = {"Origin": root(server), "Sec-Fetch-Site": "same-origin"}
        r = browser.post("/console/settings/api-keys/", headers=own, name="mine")
        assert r.status_code == 201, r.text
        fresh.get("/console/signin")
        assert fresh.post("/console/signin", headers=own, **sign_in).status_code == 303


def test_no_console_response_can_be_framed_and_pages_are_not_stored(server: Server) -> None:
    _account(server, "frames@example.com")
    with Browser(server) as anonymous, _signed_in(server, "frames@example.com") as browser:
        signed_out = [
            anonymous.get("/console/signin"),
            anonymous.get("/console/signup?token=x"),
            anonymous.post("/console/signin", email="frames@example.com", password="wrong"),
            anonymous.get("/console/projects/"),  # a redirect to the sign-in form
            anonymous.get("/console/static/console.css"),
            anonymous.get("/console/no-such-page"),
        ]
        signed_in = [
            browser.get("/console/projects/"),
            browser.get("/console/settings/api-keys/"),
            browser.get("/console/projects/no-such-project"),  # the error page
        ]
        for r in [*signed_out, *signed_in]:
            policy = r.headers.get("content-security-policy", "")
            assert "frame-ancestors 'none'" in policy, (r.url, r.headers)
            assert r.headers.get("x-frame-options") == "DENY", r.url
        assert signed_out[2].status_code == 401 and 'name="csrf_token"' in signed_out[2].text
        for r in [*signed_out[:3], *signed_in]:  # every page that holds a token or an account's
            assert r.headers.get("cache-control") == "no-store", (r.url, r.headers)


def test_sign_in_gives_a_new_session_and_a_planted_one_is_worthless(server: Server) -> None:
    _account(server, "fixation@example.com")
    with Browser(server) as browser:
        browser.http.cookies.set(
            "pgplane_session", "planted-by-an-attacker", domain="127.0.0.1", path="/console"
        )
        assert browser.get("/console/projects/").status_code == 303  # not a session
        assert browser.sign_in("fixation@example.com").status_code == 303
        first = browser.session
        assert first and first != "planted-by-an-attacker"
        browser.get("/console/projects/")  # signed in: the form carries the session's token
        r = browser.post("/console/signin", email="fixation@example.com", password=PASSWORD)
        assert r.status_code == 303
        assert browser.session not in (first, None)
        with Browser(server) as old:  # the session it replaced is over
            old.http.cookies.set("pgplane_session", first, domain="127.0.0.1", path="/console")
            assert old.get("/console/projects/").status_code == 303
        set_cookie = browser.http.get("/console/signin").headers.get("set-cookie", "")
        with Browser(server) as again:
            r = again.sign_in("fixation@example.com")
            cookie = r.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=lax" in cookie and "Path=/console" in cookie
        assert "pgplane_session" not in set_cookie


def test_sign_out_ends_the_session_and_everywhere_ends_them_all(server: Server) -> None:
    _account(server, "signout@example.com")
    with (
        _signed_in(server, "signout@example.com") as one,
        _signed_in(server, "signout@example.com") as two,
        _signed_in(server, "signout@example.com") as three,
    ):
        stolen = one.session
        one.get("/console/projects/")
        assert one.post("/console/signout").status_code == 303
        with Browser(server) as thief:
            thief.http.cookies.set(
                "pgplane_session", stolen or "", domain="127.0.0.1", path="/console"
            )
            assert thief.get("/console/projects/").status_code == 303  # to the sign-in form
        assert two.get("/console/projects/").status_code == 200  # only that one ended
        assert two.post("/console/signout", everywhere="1").status_code == 303
        assert three.get("/console/projects/").status_code == 303


def test_wrong_passwords_are_throttled() -> None:
    with running_server() as server:
        _account(server, "victim@example.com")
        with Browser(server) as guesser:
            statuses = [
                guesser.sign_in("victim@example.com", password=f"guess {n}").status_code
                for n in range(10)
            ]
            assert statuses == [401] * 10
            r = guesser.sign_in("victim@example.com")  # the right one, too late
            assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1
            assert guesser.session is None


def test_no_page_or_action_reaches_another_accounts_objects(server: Server) -> None:
    """A matrix like the API's: every page and form of the console, for another account's
    project, branch, compute, role, database, snapshot, backup schedule and key, answers the
    API's 404 and changes nothing."""
    _account(server, "owner@example.com")
    _account(server, "neighbour@example.com")
    with (
        _signed_in(server, "owner@example.com") as owner,
        _signed_in(server, "neighbour@example.com") as neighbour,
    ):
        key = owner.create_key("owner's")
        with Api(server, key) as api:
            body = api.create_project(name="private")
            pid, bid = body["project"]["id"], body["branch"]["id"]
            eid = body["endpoints"][0]["id"]
            key_id = api.http.get("/api_keys").json()[0]["id"]
            taken = api.http.post(f"/projects/{pid}/branches/{bid}/snapshot", params={"name": "s"})
            sid = api.settled(pid, taken)["snapshot"]["id"]
            before = _state(api, pid)
            project = f"/console/projects/{pid}"
            branch = f"{project}/branches/{bid}"
            pages = [
                project,
                f"{project}?branch={bid}",
                f"{project}/operations/",
                f"{project}/snapshots",
                f"{project}/snapshots?branch={bid}",
            ]
            forms = [
                f"{project}/rename",
                f"{project}/delete",
                f"{project}/branches",
                *(f"{project}/endpoints/{eid}/{a}" for a in ("start", "suspend", "restart")),
                f"{project}/endpoints/{eid}/delete",
                f"{branch}/endpoints",
                f"{branch}/snapshot",
                f"{branch}/backup_schedule",
                *(f"{project}/snapshots/{sid}/{a}" for a in ("rename", "expiry", "delete")),
                *(f"{project}/snapshots/{sid}/{a}" for a in ("restore", "finalize")),
                f"{branch}/expiry",
                f"{branch}/roles",
                *(f"{branch}/roles/neondb_owner/{a}" for a in ("reveal", "reset_password")),
                f"{branch}/roles/neondb_owner/delete",
                f"{branch}/databases",
                f"{branch}/databases/neondb/delete",
                f"/console/settings/api-keys/{key_id}/revoke",
            ]
            neighbour.get("/console/projects/")
            for path in pages:
                r = neighbour.get(path)
                assert r.status_code == 404, (path, r.status_code)
                assert "private" not in r.text
            for path in forms:
                r = neighbour.post(
                    path,
                    name="taken",
                    confirm_name="private",
                    owner_name="x",
                    type="read_only",
                    target_branch_id=bid,
                    daily="1",
                    expires_in="",
                )
                assert r.status_code == 404, (path, r.status_code, r.text[:300])
            assert "private" not in neighbour.get("/console/projects/").text
            assert _state(api, pid) == before
            assert api.http.get("/projects").status_code == 200  # the key was not revoked


def _state(api: Api, pid: str) -> tuple[object, ...]:
    project = api.http.get(f"/projects/{pid}").json()["project"]
    branches = api.http.get(f"/projects/{pid}/branches").json()["branches"]
    ops = api.operations(pid)
    main = next(b for b in branches if b["default"])["id"]
    roles = api.http.get(f"/projects/{pid}/branches/{main}/roles").json()["roles"]
    password = api.http.get(
        f"/projects/{pid}/branches/{main}/roles/neondb_owner/reveal_password"
    ).json()["password"]
    snapshots = api.http.get(f"/projects/{pid}/snapshots").json()["snapshots"]
    endpoints = api.http.get(f"/projects/{pid}/endpoints").json()["endpoints"]
    schedule = api.http.get(f"/projects/{pid}/branches/{main}/backup_schedule").json()
    return (
        project["name"],
        sorted(b["id"] for b in branches),
        len(ops),
        sorted(r["name"] for r in roles),
        password,
        sorted((s["id"], s["name"]) for s in snapshots),
        sorted((e["id"], e["type"]) for e in endpoints),
        schedule,
    )


def test_every_console_page_needs_a_session(server: Server) -> None:
    with httpx.Client(base_url=f"http://127.0.0.1:{server.port}", timeout=30) as anonymous:
        for path in ("/console/projects/", "/console/settings/api-keys/", "/console/projects/x"):
            r = anonymous.get(path)
            assert r.status_code == 303 and r.headers["location"] == "/console/signin", path
        r = anonymous.post("/console/projects/", data={"name": "x"})
        assert r.status_code in (303, 403)
        assert re.search("Sign in", anonymous.get("/console/signin").text)


def test_the_api_reference_is_a_page_that_needs_nothing_from_the_internet(server: Server) -> None:
    r = httpx.get(f"http://127.0.0.1:{server.port}/docs")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/html")
    # Every operation of the document, and nothing loaded from elsewhere: no script at all.
    document = httpx.get(f"{server.base_url}/openapi.json").json()
    for item in document["paths"].values():
        for op in item.values():
            assert f'id="{op["operationId"]}"' in r.text
    assert "<script" not in r.text
    assert re.findall(r'(?:src|href)="(?!/|#)', r.text) == []


def test_the_first_sign_up_takes_over_the_account_the_command_line_made() -> None:
    """Set up headless first: an API key from the CLI (its account admin@localhost, which signs
    in nowhere) and a project made with it. The person who then signs up with the link serve
    printed gets that account, under their email, with the key and the project: not a second,
    empty account beside it. A later account is one of its own."""
    with running_server() as server:
        done = run_cli("api-keys", "create", "--name", "ci", data_dir=server.data_dir)
        assert done.returncode == 0, done.stderr
        key = json.loads(done.stdout)["key"]
        with Api(server, key) as api:
            pid = api.create_project(name="made-headless")["project"]["id"]
        with Browser(server) as founder:
            r = founder.sign_up(signup_link(server), "founder@example.com")
            assert r.status_code == 303, r.text
            assert pid in founder.get("/console/projects").text
        accounts = json.loads(run_cli("accounts", "list", data_dir=server.data_dir).stdout)
        assert [a["email"] for a in accounts] == ["founder@example.com"], accounts
        with Api(server, key) as api:  # the key is the founder's now, as it was
            assert api.http.get(f"/projects/{pid}").status_code == 200
        done = run_cli("accounts", "invite", "second@example.com", data_dir=server.data_dir)
        assert done.returncode == 0, done.stderr
        with Browser(server) as second:
            assert second.sign_up(done.stdout.strip(), "second@example.com").status_code == 303
            assert pid not in second.get("/console/projects").text
