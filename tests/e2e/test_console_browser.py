"""A new user's first hour in the console, in a real Chromium (the system's, driven by Playwright).

From the sign-up link ``serve`` printed to a revoked key: the account, the first API key (read
from the page and used on the API), a project whose operations go from Scheduling / In progress
to OK on a page nobody reloads, its connection string copied and queried, a branch in the tree,
a compute suspended and started, a role's password reset, a snapshot taken and restored into a
new branch, the key revoked. A second account,
in a browser context of its own, sees none of it.

With ``PGPLANE_SCREENSHOTS=<dir>`` the test saves the main pages there (docs/console/ holds the
ones the README shows).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg
import pytest
from playwright.sync_api import Browser, BrowserContext, Page, expect, sync_playwright

from tests.console import PASSWORD, root, signup_link
from tests.support import Server, run_cli, running_server

CHROMIUM = "/usr/bin/chromium"
# As the machine's own check of Chromium runs it: no sandbox as root, nothing that reaches out.
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
# The compute's first start waits 3 s: long enough to see the operation unsettled on the page.
SLOW_START = "before:start_compute=1*sleep(3000)"
UNSETTLED = re.compile(r"Scheduling|In progress")


@pytest.fixture(scope="module")
def chromium() -> Iterator[Browser]:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: scripts/test installs Debian's chromium package")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        yield browser
        browser.close()


def _context(chromium: Browser, server: Server) -> BrowserContext:
    context = chromium.new_context(base_url=root(server), viewport={"width": 1200, "height": 900})
    context.grant_permissions(["clipboard-read", "clipboard-write"], origin=root(server))
    return context


def _shot(page: Page, name: str) -> None:
    where = os.environ.get("PGPLANE_SCREENSHOTS")
    if where:
        Path(where).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(where) / f"{name}.png"), full_page=True)


def _settled(page: Page) -> None:
    ops = page.get_by_test_id("operations")
    expect(ops).not_to_contain_text(UNSETTLED, timeout=60_000)
    expect(ops).to_contain_text("OK")


def test_a_new_users_first_hour(chromium: Browser) -> None:
    with running_server(PGPLANE_FAILPOINTS=SLOW_START) as server:
        context = _context(chromium, server)
        page = context.new_page()
        page.on("dialog", lambda dialog: dialog.accept())  # every "are you sure?"
        _sign_up(page, server)
        api = _first_key(page, server)
        try:
            pid = _project(page, api)
            _branch(page)
            _suspend_and_start(page)
            _reset_password(page)
            _snapshot_restored(page, pid)
            _at_phone_width(page, pid)
            _revoke(page, api)
        finally:
            api.close()
        _another_account_sees_none_of_it(chromium, server, pid)
        context.close()


def _sign_up(page: Page, server: Server) -> None:
    """The account, from the link serve printed."""
    page.goto(signup_link(server))
    page.get_by_label("Email").fill("me@example.com")
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Create account").click()
    expect(page.get_by_role("heading", name="Projects")).to_be_visible()


def _first_key(page: Page, server: Server) -> httpx.Client:
    """The first API key, read from the page, works on the API."""
    page.get_by_role("link", name="Account settings").click()
    page.get_by_label("Name of the new key").fill("laptop")
    page.get_by_role("button", name="Create new key").click()
    expect(page.get_by_text("it will not be shown again")).to_be_visible()
    _shot(page, "api-keys")
    key = (page.locator("#new-key").text_content() or "").strip()
    api = httpx.Client(
        base_url=server.base_url, headers={"Authorization": f"Bearer {key}"}, timeout=30
    )
    assert api.get("/projects").status_code == 200
    return api


def _project(page: Page, api: httpx.Client) -> str:
    """A project: its operations settle on the page while nobody reloads it; its connection
    string, copied, runs a query."""
    page.get_by_role("link", name="Projects").click()
    page.get_by_label("Name").fill("first-hour")
    page.get_by_role("button", name="Create project").click()
    expect(page.get_by_role("heading", name=re.compile("first-hour"))).to_be_visible()
    page.evaluate("window.notReloaded = true")
    expect(page.get_by_test_id("operations")).to_contain_text(UNSETTLED)
    _shot(page, "project-creating")
    _settled(page)
    assert page.evaluate("window.notReloaded === true")
    expect(page.get_by_test_id("branch-tree")).to_contain_text("compute: active")

    page.locator("[data-copy='#uri']").click()
    uri = page.evaluate("navigator.clipboard.readText()")
    listed = api.get("/projects").json()["projects"]
    pid = str(next(p["id"] for p in listed if p["name"] == "first-hour"))
    params = {"role_name": "neondb_owner", "database_name": "neondb"}
    assert uri == api.get(f"/projects/{pid}/connection_uri", params=params).json()["uri"]
    with psycopg.connect(uri, connect_timeout=30) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
    return pid


def _branch(page: Page) -> None:
    """A branch, in the tree under its parent; the page then shows it."""
    page.get_by_label("Branch name").fill("dev")
    page.get_by_role("button", name="Create branch").click()
    _settled(page)
    tree = page.get_by_test_id("branch-tree")
    expect(tree.locator("li li a", has_text="dev")).to_be_visible()
    _shot(page, "project")


def _suspend_and_start(page: Page) -> None:
    computes = page.locator("tr[data-endpoint]")
    computes.get_by_role("button", name="Suspend", exact=True).click()
    expect(computes).to_contain_text("idle", timeout=60_000)
    computes.get_by_role("button", name="Start", exact=True).click()
    expect(computes).to_contain_text("active", timeout=60_000)
    expect(computes).not_to_contain_text("→")


def _reset_password(page: Page) -> None:
    """Reset the owner's password on the branch shown: its old connection string stops
    working, the new one shown works."""
    page.locator("select[name=role]").select_option("neondb_owner")
    old = page.get_by_test_id("connection-uri").text_content() or ""
    row = page.locator("tr", has_text="neondb_owner")
    row.get_by_role("button", name="Reset password").click()
    _settled(page)
    new = page.get_by_test_id("connection-uri").text_content() or ""
    assert new and new != old
    with psycopg.connect(new, connect_timeout=30) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
    with pytest.raises(psycopg.OperationalError, match="password"):
        psycopg.connect(old, connect_timeout=30).close()
    page.get_by_role("link", name="All operations").click()
    expect(page.get_by_test_id("operations")).to_contain_text("OK")
    _shot(page, "operations")


def _snapshot_restored(page: Page, pid: str) -> None:
    """A snapshot of the default branch, taken on the project's snapshots page (which updates
    itself until it is ready), restored into a new branch."""
    page.goto(f"/console/projects/{pid}")
    page.get_by_role("link", name="Snapshots").click()
    page.get_by_label("Snapshot name").fill("before-migration")
    page.get_by_role("button", name="Take snapshot of main").click()
    row = page.locator("tbody[data-snapshot]", has_text="before-migration")
    restore = row.get_by_role("button", name="Restore into a new branch")
    expect(restore).to_be_visible(timeout=60_000)
    _shot(page, "snapshots")
    row.get_by_placeholder("new branch name").fill("recovered")
    restore.click()
    _settled(page)
    expect(
        page.get_by_test_id("branch-tree").locator("li li a", has_text="recovered")
    ).to_be_visible()


def _at_phone_width(page: Page, pid: str) -> None:
    """The project's page fits a phone's width: nothing but its tables scrolls sideways."""
    page.set_viewport_size({"width": 390, "height": 844})
    page.goto(f"/console/projects/{pid}")
    expect(page.get_by_test_id("branch-tree")).to_be_visible()
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    _shot(page, "project-phone")
    page.set_viewport_size({"width": 1200, "height": 900})


def _revoke(page: Page, api: httpx.Client) -> None:
    """Revoke the key: the API refuses it at once."""
    page.get_by_role("link", name="Account settings").click()
    page.locator("tr", has_text="laptop").get_by_role("button", name="Revoke").click()
    expect(page.get_by_text("laptop")).to_have_count(0)
    assert api.get("/projects").status_code == 401


def _another_account_sees_none_of_it(chromium: Browser, server: Server, pid: str) -> None:
    """Another account, in a browser context of its own."""
    done = run_cli(
        "accounts", "create", "other@example.com", "--password-stdin",
        data_dir=server.data_dir, stdin=PASSWORD,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    context = _context(chromium, server)
    other = context.new_page()
    other.goto("/console/signin")
    _shot(other, "signin")
    other.get_by_label("Email").fill("other@example.com")
    other.get_by_label("Password").fill(PASSWORD)
    other.get_by_role("button", name="Sign in").click()
    expect(other.get_by_role("heading", name="Projects")).to_be_visible()
    expect(other.get_by_text("first-hour")).to_have_count(0)
    response = other.goto(f"/console/projects/{pid}")
    assert response is not None and response.status == 404
    context.close()


def test_a_compute_that_cannot_start_says_why_and_its_settings_are_mended_here(
    chromium: Browser,
) -> None:
    # Two attempts, not five: the reason is the same each time.
    with running_server(PGPLANE_MAX_ATTEMPTS="2") as server:
        made = run_cli(
            "accounts", "create", "me@example.com", "--password-stdin",
            data_dir=server.data_dir, stdin=f"{PASSWORD}\n",
        )  # fmt: skip
        assert made.returncode == 0, made.stderr
        key = json.loads(
            run_cli("api-keys", "create", "--name", "k", data_dir=server.data_dir).stdout
        )
        with httpx.Client(
            base_url=server.base_url,
            headers={"Authorization": f"Bearer {key['key']}"},
            timeout=30,  # not httpx's 5 s: a loaded machine may take longer
        ) as api:
            r = api.post("/projects", json={"project": {"name": "broken"}})
            assert r.status_code == 201, r.text
            pid, eid = r.json()["project"]["id"], r.json()["endpoints"][0]["id"]
            # Valid to Postgres' check of the value, refused by its start-up.
            broken = {"settings": {"pg_settings": {"max_connections": "1"}}}
            assert api.patch(
                f"/projects/{pid}/endpoints/{eid}", json={"endpoint": broken}
            ).is_success
        context = _context(chromium, server)
        page = context.new_page()
        page.goto("/console/signin")
        page.get_by_label("Email").fill("me@example.com")
        page.get_by_label("Password").fill(PASSWORD)
        page.get_by_role("button", name="Sign in").click()
        page.goto(f"/console/projects/{pid}")
        failure = page.get_by_test_id("start-failure")
        expect(failure).to_be_visible(timeout=60_000)  # the page updates itself until then
        failure.locator("summary").click()
        expect(failure).to_contain_text('"max_connections" (1)')
        computes = page.locator("tr[data-endpoint]")
        expect(computes).not_to_contain_text("→")  # nothing pretends to be under way
        # Its retries show as attempts, and what it took is what the user waited.
        expect(page.get_by_test_id("operations")).to_contain_text("2 attempts")
        _shot(page, "compute-failed")

        settings = page.get_by_test_id("pg-settings")
        expect(settings).to_have_value("max_connections = 1\n")
        settings.fill("max_connections = 20\n")
        page.get_by_role("button", name="Save settings").click()
        computes.get_by_role("button", name="Start", exact=True).click()
        expect(computes).to_contain_text("active", timeout=60_000)
        expect(page.get_by_test_id("start-failure")).to_have_count(0)
        context.close()
