"""Neon's ``endpoint=<id>;<password>`` password, for clients that send neither SNI nor
``options``, against a real server: psycopg connecting by address (libpq sends no SNI for an
address), byte-level clients where the source address matters (127.0.0.2 beside 127.0.0.1).
"""

from __future__ import annotations

import socket
import ssl
import struct
from typing import Any

import psycopg
import pytest

from pgplane.proxy import wire
from tests import pgclient
from tests.e2e.test_allowed_ips import NEON_WORDS, OTHER
from tests.support import Api, Server, spend_refill, until_throttled

UNNAMED = (
    "endpoint not specified: connect to ep-<id>.localhost (TLS with SNI), pass"
    " options=endpoint=<id> as in the connection URI the API returns, or give"
    " endpoint=<id>;<password> as the password (over TLS only)"
)


def _params(project: dict[str, Any]) -> dict[str, str]:
    return dict(project["connection_uris"][0]["connection_parameters"])


def _by_address(server: Server, user: str, password: str, **extra: Any) -> dict[str, Any]:
    """Connection parameters naming no endpoint: the proxy by address, nothing in options."""
    return {
        "host": "127.0.0.1", "port": server.proxy_port, "user": user, "password": password,
        "dbname": "neondb", "connect_timeout": 60, "sslmode": "verify-full",
        "sslrootcert": str(server.data_dir / "tls" / "ca.crt"), **extra,
    }  # fmt: skip


def _starts(api: Api, pid: str) -> int:
    return sum(o["action"] == "start_compute" for o in api.operations(pid))


def _tls_login(server: Server, source: str, password: str) -> tuple[str, str]:
    """A TLS login without SNI or options from ``source``, giving ``password`` when asked:
    ("", "") once in (ReadyForQuery), else the refusal's SQLSTATE and message."""
    raw = pgclient.connect(server.proxy_port, source=source)
    raw.sendall(struct.pack("!II", 8, wire.SSL_REQUEST))
    assert raw.recv(1) == b"S"
    context = ssl.create_default_context(cafile=server.data_dir / "tls" / "ca.crt")
    context.check_hostname = False  # by address, without SNI: the certificate is still verified
    with context.wrap_socket(raw) as sock:
        startup = wire.Startup(wire.PROTOCOL_3, {"user": "neondb_owner", "database": "neondb"})
        sock.sendall(startup.encode())
        return _answer(sock, password)


def _answer(sock: socket.socket, password: str) -> tuple[str, str]:
    while True:
        kind, payload = pgclient._read_message(sock)
        if kind == b"E":
            fields = wire.error_fields(payload)
            return fields.get("C", ""), fields.get("M", "")
        if kind == b"R" and struct.unpack("!I", payload[:4])[0] == wire.AUTH_CLEARTEXT:
            sock.sendall(wire.password_message(password.encode() + b"\0"))
        elif kind == b"Z":
            sock.sendall(b"X" + struct.pack("!I", 4))
            return "", ""


def test_the_endpoint_in_the_password_logs_in_and_wakes(server: Server, api: Api) -> None:
    project = api.create_ready_project(name="password-form")
    pid, eid = project["project"]["id"], project["endpoints"][0]["id"]
    params = _params(project)
    api.suspend(pid, eid)
    starts = _starts(api, pid)
    user, password = params["role"], params["password"]
    with psycopg.connect(**_by_address(server, user, f"endpoint={eid};{password}")) as conn:
        assert conn.execute("select current_user").fetchone() == (user,)
        assert conn.info.pgconn.ssl_in_use
    assert _starts(api, pid) == starts + 1
    # Neon's other spellings: project= for endpoint=, $ for ;, the pooler's name.
    for form in (f"project={eid};{password}", f"endpoint={eid}$" + password,
                 f"endpoint={eid}-pooler;{password}"):  # fmt: skip
        with psycopg.connect(**_by_address(server, user, form)) as conn:
            assert conn.execute("select 1").fetchone() == (1,)


def test_a_wrong_password_is_refused_wakes_nothing_and_is_throttled(
    server: Server, api: Api
) -> None:
    project = api.create_ready_project(name="password-form-wrong")
    pid, eid = project["project"]["id"], project["endpoints"][0]["id"]
    params = _params(project)
    api.suspend(pid, eid)
    starts = _starts(api, pid)
    wrong = _by_address(server, params["role"], f"endpoint={eid};guess")
    refused = f'password authentication failed for user "neondb_owner" (or endpoint {eid}'
    with pytest.raises(psycopg.OperationalError, match=refused.replace("(", r"\(")):
        psycopg.connect(**wrong)

    def refusal() -> str:
        with pytest.raises(psycopg.OperationalError) as caught:
            psycopg.connect(**wrong)
        return str(caught.value)

    def failed(refused: str) -> bool:
        return "password authentication failed" in refused

    for _ in range(30):
        refusal()
    assert "too many failed logins" in until_throttled(refusal, failed)
    # Then the right password too, from this address; another address logs in as usual.
    spend_refill(refusal, failed)
    right = f"endpoint={eid};{params['password']}"
    with pytest.raises(psycopg.OperationalError, match="too many failed logins"):
        psycopg.connect(**_by_address(server, params["role"], right))
    assert _starts(api, pid) == starts
    assert _tls_login(server, OTHER, right) == ("", "")
    assert _starts(api, pid) == starts + 1


def test_another_accounts_endpoint_is_refused_as_one_that_does_not_exist(
    server: Server, api: Api, other_api: Api
) -> None:
    mine = _params(api.create_ready_project(name="password-form-mine"))
    theirs = other_api.create_ready_project(name="password-form-theirs")
    their_pid, their_eid = theirs["project"]["id"], theirs["endpoints"][0]["id"]
    other_api.suspend(their_pid, their_eid)
    starts = _starts(other_api, their_pid)
    made_up = "ep-no-such-endpoint-12345678"

    def refusal(endpoint: str) -> str:
        form = f"endpoint={endpoint};{mine['password']}"
        with pytest.raises(psycopg.OperationalError) as caught:
            psycopg.connect(**_by_address(server, mine["role"], form))
        return str(caught.value).replace(endpoint, "<id>")

    assert refusal(their_eid) == refusal(made_up)
    assert 'password authentication failed for user "neondb_owner"' in refusal(made_up)
    assert _starts(other_api, their_pid) == starts


def test_an_address_off_the_allow_list_is_refused_before_its_password(
    server: Server, api: Api
) -> None:
    project = api.create_ready_project(
        name="password-form-allow", settings={"allowed_ips": {"ips": ["127.0.0.1"]}}
    )
    pid, eid = project["project"]["id"], project["endpoints"][0]["id"]
    right = f"endpoint={eid};{_params(project)['password']}"
    api.suspend(pid, eid)
    starts = _starts(api, pid)
    # Right or wrong, the password is never looked at; many times over, nothing is counted.
    assert _tls_login(server, OTHER, right) == ("XX000", NEON_WORDS)
    for _ in range(35):
        assert _tls_login(server, OTHER, f"endpoint={eid};guess") == ("XX000", NEON_WORDS)
    assert _starts(api, pid) == starts
    # Listed, the address logs in at once: none of those refusals was a throttled failure.
    r = api.http.patch(
        f"/projects/{pid}", json={"project": {"settings": {"allowed_ips": {"ips": []}}}}
    )
    assert r.status_code == 200, r.text
    assert _tls_login(server, OTHER, right) == ("", "")
    assert _starts(api, pid) == starts + 1


def test_without_an_endpoint_the_error_names_the_three_ways(server: Server, api: Api) -> None:
    params = _params(api.create_ready_project(name="password-form-none"))
    # Over TLS, a password that does not name one.
    with pytest.raises(psycopg.OperationalError, match="endpoint not specified") as caught:
        psycopg.connect(**_by_address(server, params["role"], params["password"]))
    assert UNNAMED in str(caught.value)
    # On a plaintext connection the password is not even asked for: it would cross in clear.
    with pgclient.connect(server.proxy_port) as sock:
        startup = wire.Startup(wire.PROTOCOL_3, {"user": "neondb_owner", "database": "neondb"})
        sock.sendall(startup.encode())
        kind, payload = pgclient._read_message(sock)
    assert kind == b"E"
    assert wire.error_fields(payload)["M"] == UNNAMED
