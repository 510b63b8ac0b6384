"""Neon's serverless driver over WebSockets (``Pool``, ``Client``, Drizzle's ``neon-serverless``),
the real one from npm, latest and 0.10, against a real server and real Postgres.

The driver keeps its defaults but for where the proxy is: this machine cannot resolve
``*.localhost`` and the proxy is not on port 443, so ``neonConfig.wsProxy`` names it (with
``useSecureWebSocket`` false for ``ws://``). The proxy's certificate is handed to node with
``NODE_EXTRA_CA_CERTS``. The endpoint then comes from the URI's ``options=endpoint=``, as the
API returns it; the ``Host`` and ``address=`` ways are tried byte by byte below.
"""

from __future__ import annotations

import contextlib
import socket
import struct
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect as ws_connect

from pgplane.proxy import wire
from tests import pgclient, serverless
from tests.support import Api, Server

OTHER = "127.0.0.2"


@pytest.fixture(scope="module", params=[serverless.LATEST, serverless.OLD])
def driver(request: pytest.FixtureRequest) -> serverless.Installation:
    return serverless.install(request.param)


def _run(
    server: Server, driver: serverless.Installation, scenario: str, uri: str, **kw: Any
) -> Any:
    return serverless.run(
        driver,
        scenario,
        uri=uri,
        ws_proxy=f"127.0.0.1:{server.proxy_port}/v2",
        ca_file=server.data_dir / "tls" / "ca.crt",
        **kw,
    )


def _starts(api: Api, pid: str) -> int:
    return sum(o["action"] == "start_compute" for o in api.operations(pid))


def test_pool_and_client_with_transactions_and_a_wake(
    server: Server, api: Api, driver: serverless.Installation
) -> None:
    project = api.create_ready_project(name="ws-driver")
    pid, eid = project["project"]["id"], project["endpoints"][0]["id"]
    uri = project["connection_uris"][0]["connection_uri"]
    api.suspend(pid, eid)
    starts = _starts(api, pid)

    # Suspended: the first connection wakes it.
    out = _run(server, driver, "pool", uri)
    assert out == {"seen": [1, 1], "counts": {"kept": 1, "dropped": 0}, "user": "neondb_owner"}
    assert _starts(api, pid) == starts + 1
    api.suspend(pid, eid)
    out = _run(server, driver, "client", uri)  # wakes it again
    assert _starts(api, pid) == starts + 2
    assert out == {"seen": [2, 1], "counts": {"kept": 2, "dropped": 0}, "big": 3 << 20}
    # ws:// (the user chose no TLS): the same door, the same password asked for.
    out = _run(server, driver, "client", uri, secure=False)
    assert out == {"seen": [3, 1], "counts": {"kept": 3, "dropped": 0}, "big": 3 << 20}
    # Not pipelined: the driver waits to be asked for the password, then sends it.
    out = _run(server, driver, "client", uri, pipeline=False)
    assert out == {"seen": [4, 1], "counts": {"kept": 4, "dropped": 0}, "big": 3 << 20}


def test_drizzle_neon_serverless_wakes_its_compute(
    server: Server, api: Api, driver: serverless.Installation
) -> None:
    project = api.create_ready_project(name="ws-drizzle")
    pid, eid = project["project"]["id"], project["endpoints"][0]["id"]
    uri = project["connection_uris"][0]["connection_uri"]
    api.suspend(pid, eid)
    assert _run(server, driver, "drizzle", uri) == {"values": [41]}
    assert api.endpoint(pid, eid)["current_state"] == "active"


def test_a_wrong_password_is_refused_and_wakes_nothing(
    server: Server, api: Api, driver: serverless.Installation
) -> None:
    project = api.create_ready_project(name="ws-wrong")
    pid, eid = project["project"]["id"], project["endpoints"][0]["id"]
    uri = project["connection_uris"][0]["connection_uri"]
    password = project["connection_uris"][0]["connection_parameters"]["password"]
    api.suspend(pid, eid)
    starts = _starts(api, pid)
    out = _run(server, driver, "login", uri.replace(password, "wrong-password"))
    assert out == {
        "error": 'password authentication failed for user "neondb_owner"',
        "code": "28P01",
    }
    assert _starts(api, pid) == starts
    assert api.endpoint(pid, eid)["current_state"] == "idle"


# Byte by byte: the endpoint from Host or address=, and a source address the driver cannot set.


def _credentials(uri: str) -> dict[str, str]:
    parts = urlsplit(uri)
    return {
        "endpoint": dict(parse_qsl(parts.query))["options"].removeprefix("endpoint="),
        "user": unquote(parts.username or ""),
        "password": unquote(parts.password or ""),
        "database": parts.path.lstrip("/"),
    }


def ws_login(
    port: int,
    *,
    user: str,
    password: str,
    database: str,
    options: str | None = None,
    host: str | None = None,
    query: str = "",
    source: str = "127.0.0.1",
) -> tuple[str, str]:
    """Log in on the WebSocket door as the driver does (startup and cleartext password at
    once): ("", "") once ReadyForQuery came, else the refusal's SQLSTATE and message."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=60, source_address=(source, 0))
    params = {"user": user, "database": database}
    if options:
        params["options"] = options
    uri = f"ws://{host or f'127.0.0.1:{port}'}/v2{query}"
    with ws_connect(uri, sock=sock, compression=None, open_timeout=30) as ws:
        ws.send(wire.Startup(wire.PROTOCOL_3, params).encode())
        # Refused on its startup alone, the socket may be closing already: the refusal came.
        with contextlib.suppress(ConnectionClosed):
            ws.send(wire.password_message(password.encode() + b"\0"))
        data = b""
        while True:
            while len(data) < 5 or len(data) < 1 + struct.unpack("!I", data[1:5])[0]:
                chunk = ws.recv(timeout=60)
                assert isinstance(chunk, bytes)
                data += chunk
            length = struct.unpack("!I", data[1:5])[0]
            kind, payload, data = data[:1], data[5 : 1 + length], data[1 + length :]
            if kind == b"E":
                fields = wire.error_fields(payload)
                return fields["C"], fields["M"]
            if kind == b"Z":
                return "", ""


def test_the_endpoint_comes_from_host_then_options_then_address(server: Server, api: Api) -> None:
    project = api.create_ready_project(name="ws-host")
    creds = _credentials(project["connection_uris"][0]["connection_uri"])
    eid = creds.pop("endpoint")
    port = server.proxy_port
    assert ws_login(port, **creds, host=f"{eid}.localhost:{port}") == ("", "")
    assert ws_login(port, **creds, host=f"{eid}-pooler.localhost") == ("", "")
    assert ws_login(port, **creds, options=f"endpoint={eid}") == ("", "")
    assert ws_login(port, **creds, query=f"?address={eid}.localhost:5432") == ("", "")
    code, message = ws_login(port, **creds)
    assert (code, message.split(":")[0]) == ("08004", "endpoint not specified")


def test_another_accounts_endpoint_is_refused_as_on_tcp_and_wakes_nothing(
    server: Server, api: Api, other_api: Api
) -> None:
    """My role and password on another account's endpoint: a wrong password, as on TCP (the
    proxy knows no accounts: an endpoint and a role's password are what a login has), and its
    compute never wakes. An endpoint nobody has is refused the same way, on both doors."""
    mine = _credentials(
        api.create_ready_project(name="ws-mine")["connection_uris"][0]["connection_uri"]
    )
    theirs = other_api.create_ready_project(name="ws-theirs")
    their_pid, their_eid = theirs["project"]["id"], theirs["endpoints"][0]["id"]
    other_api.suspend(their_pid, their_eid)
    starts = _starts(other_api, their_pid)
    mine.pop("endpoint")
    port = server.proxy_port
    on_theirs = ws_login(port, **mine, options=f"endpoint={their_eid}")
    assert on_theirs == ("28P01", 'password authentication failed for user "neondb_owner"')
    assert pgclient.refusal(port, endpoint=their_eid, **mine) == on_theirs[1]
    nowhere = "ep-nobody-has-this-12345"
    assert ws_login(port, **mine, options=f"endpoint={nowhere}") == on_theirs
    assert pgclient.refusal(port, endpoint=nowhere, **mine) == on_theirs[1]
    assert _starts(other_api, their_pid) == starts


def test_the_allow_list_refuses_an_address_on_the_websocket_door(server: Server, api: Api) -> None:
    project = api.create_ready_project(
        name="ws-allow", settings={"allowed_ips": {"ips": ["127.0.0.1"]}}
    )
    pid, eid = project["project"]["id"], project["endpoints"][0]["id"]
    creds = _credentials(project["connection_uris"][0]["connection_uri"])
    creds["options"] = f"endpoint={creds.pop('endpoint')}"
    api.suspend(pid, eid)
    starts = _starts(api, pid)
    words = (
        f"This IP address {OTHER} is not allowed to connect to this endpoint. Please add it to"
        " the allowed list in the project's settings (settings.allowed_ips; neonctl ip-allow"
        " add). Make sure to check for IPv4 or IPv6 addresses."
    )
    port = server.proxy_port
    # Refused before the password: right or wrong, the same words, and nothing wakes.
    assert ws_login(port, **creds, source=OTHER) == ("XX000", words)
    assert ws_login(port, **{**creds, "password": "wrong"}, source=OTHER) == ("XX000", words)
    assert _starts(api, pid) == starts
    assert ws_login(port, **creds) == ("", "")  # from the listed address it wakes and logs in
    assert _starts(api, pid) == starts + 1
