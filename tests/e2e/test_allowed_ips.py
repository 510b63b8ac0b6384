"""A project's IP allow-list (``settings.allowed_ips``), set through the API and enforced by the
proxy, against a real server and real Postgres.

The proxy listens on 127.0.0.1; a client binds its socket to 127.0.0.2 (all of 127/8 is
loopback on Linux) to come from an address the list does not name. libpq cannot choose its
source address, so those logins are made byte by byte (tests/pgclient.py).
"""

from __future__ import annotations

import struct
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

import httpx
import psycopg

from tests import pgclient
from tests.neonctl import Neonctl
from tests.support import Api, Server

OTHER = "127.0.0.2"
NEON_WORDS = (
    f"This IP address {OTHER} is not allowed to connect to this endpoint. Please add it to the"
    " allowed list in the project's settings (settings.allowed_ips; neonctl ip-allow add)."
    " Make sure to check for IPv4 or IPv6 addresses."
)


def _credentials(uri: str) -> dict[str, str]:
    parts = urlsplit(uri)
    endpoint = dict(parse_qsl(parts.query))["options"].removeprefix("endpoint=")
    return {
        "endpoint": endpoint,
        "user": unquote(parts.username or ""),
        "password": unquote(parts.password or ""),
        "database": parts.path.lstrip("/"),
    }


def _login_from(server: Server, source: str, uri: str, **override: str) -> tuple[str, str]:
    """Log in through the proxy from ``source`` up to ReadyForQuery: ("", "") once in, else the
    refusal's SQLSTATE and message."""
    login = pgclient.login(server.proxy_port, source=source, **{**_credentials(uri), **override})
    with login.sock as sock:
        if login.error is not None:
            return login.code or "", login.error
        while True:
            kind, payload = pgclient._read_message(sock)
            if kind == b"E":
                return "error after login", payload.decode(errors="replace")
            if kind == b"Z":
                sock.sendall(b"X" + struct.pack("!I", 4))
                return "", ""


def _starts(api: Api, pid: str) -> int:
    return sum(o["action"] == "start_compute" for o in api.operations(pid))


def _allowed(api: Api, pid: str) -> Any:
    r = api.http.get(f"/projects/{pid}")
    assert r.status_code == 200, r.text
    return r.json()["project"]["settings"].get("allowed_ips")


def _patch(api: Api, pid: str, settings: dict[str, Any]) -> httpx.Response:
    return api.http.patch(f"/projects/{pid}", json={"project": {"settings": settings}})


def _bad(r: httpx.Response, field: str) -> None:
    assert r.status_code == 400, r.text
    body = r.json()
    assert body["code"] == "BAD_REQUEST", body
    assert body["message"].startswith(f"{field}: "), body


def test_an_address_off_the_list_is_refused_before_its_password_and_wakes_nothing(
    server: Server, api: Api
) -> None:
    project = api.create_ready_project(
        name="allow-one", settings={"allowed_ips": {"ips": ["127.0.0.1"]}}
    )
    pid, eid = project["project"]["id"], project["endpoints"][0]["id"]
    uri = project["connection_uris"][0]["connection_uri"]
    # Neon's shape, both fields, as Neon shows it.
    assert project["project"]["settings"]["allowed_ips"] == {
        "ips": ["127.0.0.1"],
        "protected_branches_only": False,
    }
    api.suspend(pid, eid)
    starts = _starts(api, pid)

    # The right password and a wrong one get the same answer: the password is never asked for.
    assert _login_from(server, OTHER, uri) == ("XX000", NEON_WORDS)
    assert _login_from(server, OTHER, uri, password="wrong") == ("XX000", NEON_WORDS)
    assert _login_from(server, OTHER, uri, user="nobody_made_me") == ("XX000", NEON_WORDS)
    assert _starts(api, pid) == starts
    assert api.endpoint(pid, eid)["current_state"] == "idle"

    # From the listed address the owner wakes it and is in.
    with psycopg.connect(uri, connect_timeout=60) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
    assert _starts(api, pid) == starts + 1

    # Listed through the API, the other address connects too.
    r = _patch(api, pid, {"allowed_ips": {"ips": ["127.0.0.1", "127.0.0.2-127.0.0.3"]}})
    assert r.status_code == 200, r.text
    assert _login_from(server, OTHER, uri) == ("", "")
    assert _login_from(server, OTHER, uri, password="wrong")[0] == "28P01"
    # An empty list allows every address.
    assert _patch(api, pid, {"allowed_ips": {"ips": ["10.0.0.0/8"]}}).status_code == 200
    assert _login_from(server, OTHER, uri) == ("XX000", NEON_WORDS)
    assert _patch(api, pid, {"allowed_ips": {"ips": []}}).status_code == 200
    assert _login_from(server, OTHER, uri) == ("", "")


def test_bad_lists_are_400s_naming_the_field_and_change_nothing(api: Api) -> None:
    before = [p["id"] for p in api.http.get("/projects").json()["projects"]]
    for settings, field in [
        ({"allowed_ips": {"ips": ["127.0.0.1", "300.1.2.3"]}}, "settings.allowed_ips.ips[1]"),
        ({"allowed_ips": {"ips": ["10.0.0.0/33"]}}, "settings.allowed_ips.ips[0]"),
        ({"allowed_ips": {"ips": ["10.0.0.9-10.0.0.1"]}}, "settings.allowed_ips.ips[0]"),
        ({"allowed_ips": {"ips": ["localhost"]}}, "settings.allowed_ips.ips[0]"),
        ({"allowed_ips": {"ips": [7]}}, "settings.allowed_ips.ips[0]"),
        ({"allowed_ips": {"ips": "127.0.0.1"}}, "settings.allowed_ips.ips"),
        ({"allowed_ips": ["127.0.0.1"]}, "settings.allowed_ips"),
        (
            {"allowed_ips": {"ips": [], "protected_branches_only": "yes"}},
            "settings.allowed_ips.protected_branches_only",
        ),
        # Neon's older field: not honoured here, so not stored as if it were.
        (
            {"allowed_ips": {"ips": ["127.0.0.1"], "primary_branch_only": True}},
            "settings.allowed_ips.primary_branch_only",
        ),
    ]:
        _bad(api.http.post("/projects", json={"project": {"settings": settings}}), field)
    assert [p["id"] for p in api.http.get("/projects").json()["projects"]] == before

    project = api.create_ready_project(
        name="allow-bad", settings={"allowed_ips": {"ips": ["127.0.0.1"]}}
    )
    pid = project["project"]["id"]
    _bad(
        _patch(api, pid, {"allowed_ips": {"ips": ["1.2.3.4", "1.2.3"]}}),
        "settings.allowed_ips.ips[1]",
    )
    assert _allowed(api, pid) == {"ips": ["127.0.0.1"], "protected_branches_only": False}


def test_other_settings_change_without_dropping_the_list(server: Server, api: Api) -> None:
    """An update sets the settings it names, as Neon's does: changing another one must not drop
    the list, which would open the project to every address."""
    project = api.create_ready_project(
        name="allow-keep", settings={"allowed_ips": {"ips": ["127.0.0.1"]}}
    )
    pid = project["project"]["id"]
    uri = project["connection_uris"][0]["connection_uri"]
    r = _patch(api, pid, {"quota": {"active_time_seconds": 3600}})
    assert r.status_code == 200, r.text
    assert r.json()["project"]["settings"] == {
        "allowed_ips": {"ips": ["127.0.0.1"], "protected_branches_only": False},
        "quota": {"active_time_seconds": 3600},
    }
    assert _login_from(server, OTHER, uri) == ("XX000", NEON_WORDS)
    # Only the field named changes; null removes the list.
    r = _patch(api, pid, {"allowed_ips": {"protected_branches_only": True}})
    assert r.status_code == 200, r.text
    assert _allowed(api, pid) == {"ips": ["127.0.0.1"], "protected_branches_only": True}
    assert _patch(api, pid, {"allowed_ips": None}).status_code == 200
    assert _allowed(api, pid) is None
    assert _login_from(server, OTHER, uri) == ("", "")


def test_protected_branches_only_restricts_the_protected_branches_alone(
    server: Server, api: Api
) -> None:
    project = api.create_ready_project(
        name="allow-protected",
        settings={"allowed_ips": {"ips": ["127.0.0.1"], "protected_branches_only": True}},
    )
    pid = project["project"]["id"]
    main_uri = project["connection_uris"][0]["connection_uri"]
    r = api.http.post(
        f"/projects/{pid}/branches",
        json={"branch": {"name": "prod", "protected": True}, "endpoints": [{"type": "read_write"}]},
    )
    prod = api.settled(pid, r)
    prod_uri = prod["connection_uris"][0]["connection_uri"]
    assert prod["branch"]["protected"] is True

    assert _login_from(server, OTHER, main_uri) == ("", "")  # not protected: open
    assert _login_from(server, OTHER, prod_uri) == ("XX000", NEON_WORDS)
    assert _login_from(server, "127.0.0.1", prod_uri) == ("", "")

    # Unprotected, the branch is open; protected again, closed.
    bid = prod["branch"]["id"]
    for protected, expected in [(False, ("", "")), (True, ("XX000", NEON_WORDS))]:
        r = api.http.patch(
            f"/projects/{pid}/branches/{bid}", json={"branch": {"protected": protected}}
        )
        assert r.status_code == 200, r.text
        assert _login_from(server, OTHER, prod_uri) == expected

    # For every branch once protected_branches_only is off.
    r = _patch(api, pid, {"allowed_ips": {"ips": ["127.0.0.1"], "protected_branches_only": False}})
    assert r.status_code == 200, r.text
    assert _login_from(server, OTHER, main_uri) == ("XX000", NEON_WORDS)


def test_neonctl_ip_allow(server: Server, neonctl: Neonctl, api: Api) -> None:
    project = api.create_ready_project(name="allow-neonctl")
    pid = project["project"]["id"]
    uri = project["connection_uris"][0]["connection_uri"]
    at = ("--project-id", pid)

    out = neonctl.json("ip-allow", "add", "127.0.0.1", *at)
    assert (out["IP_addresses"], out["protected_branches_only"]) == (["127.0.0.1"], False)
    assert neonctl.json("ip-allow", "list", *at)["IP_addresses"] == ["127.0.0.1"]
    assert _login_from(server, OTHER, uri) == ("XX000", NEON_WORDS)

    out = neonctl.json("ip-allow", "add", "127.0.0.2/32", *at)
    assert sorted(out["IP_addresses"]) == ["127.0.0.1", "127.0.0.2/32"]
    assert _login_from(server, OTHER, uri) == ("", "")

    out = neonctl.json("ip-allow", "remove", "127.0.0.2/32", *at)
    assert out["IP_addresses"] == ["127.0.0.1"]
    assert _login_from(server, OTHER, uri) == ("XX000", NEON_WORDS)

    # A bad entry: neonctl shows the API's message, and the list is as it was.
    done = neonctl.run("ip-allow", "add", "127.0.0.300", *at, check=False)
    assert done.returncode != 0
    assert "settings.allowed_ips.ips[" in done.stderr, done.stderr
    assert neonctl.json("ip-allow", "list", *at)["IP_addresses"] == ["127.0.0.1"]
