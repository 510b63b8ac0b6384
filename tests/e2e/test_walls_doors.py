"""The walls hold on the proxy's HTTP and WebSocket doors as on its Postgres door.

One address (127.0.0.2) floods the proxy's one port with silent sockets, ClientHellos that stop
half-way, HTTP heads a byte a second, and WebSockets that upgrade and then say nothing: past its
share it is refused at once, the rest are closed at the handshake deadline. Meanwhile another
client (127.0.0.1) uses the API, runs a query over TCP and logs in over a WebSocket, each as fast
as without the flood. Oversized heads, bodies and frames are refused; wrong passwords on the
WebSocket door are throttled with those of the TCP door; nothing wakes before a password.
"""

from __future__ import annotations

import contextlib
import json
import socket
import ssl
import time
from collections.abc import Iterator
from typing import Any

import httpx
import psycopg
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.frames import CloseCode
from websockets.sync.client import connect as ws_connect

from pgplane.proxy import wire
from tests import pgclient
from tests.e2e.test_serverless_ws import _credentials, ws_login
from tests.e2e.test_walls_sockets import Flood, Flooder, _assert_proxy_refused, _probe
from tests.support import Api, Server, running_server, spend_refill, until_throttled

CAP = 6  # the proxy's connections per address (the same as test_walls_sockets, whose Flood runs)
FLOOD = 3 * CAP
DEADLINE = 4  # seconds: the proxy's handshake deadline, and its HTTP requests'
FLOODER = "127.0.0.2"


@pytest.fixture(scope="module")
def walled() -> Iterator[Server]:
    with running_server(
        PGPLANE_PROXY_CONNECTIONS_PER_ADDRESS=str(CAP),
        PGPLANE_PROXY_MAX_CONNECTIONS="64",
        PGPLANE_PROXY_HANDSHAKE_TIMEOUT_SECONDS=str(DEADLINE),
    ) as srv:
        yield srv


@pytest.fixture(scope="module")
def owner(walled: Server) -> Iterator[Api]:
    _, key = walled.create_key("doors-owner@example.com")
    with Api(walled, key) as api:
        yield api


def _upgrade(host: str = "127.0.0.1") -> bytes:
    return (
        f"GET /v2 HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    ).encode()


def _flooders() -> list[Flooder]:
    kinds = [
        Flooder("proxy", "silent", b"", b""),
        Flooder("proxy", "half a ClientHello", b"\x16\x03\x01\x02", b""),
        Flooder(
            "proxy", "slow HTTP head", b"", b"POST /sql HTTP/1.1\r\nHost: x\r\nX: " + b"y" * 60
        ),
        Flooder("proxy", "silent WebSocket", _upgrade(), b""),
    ]
    return [
        Flooder(f.listener, f.kind, f.first, f.drip) for i in range(FLOOD) for f in [kinds[i % 4]]
    ]


def _starts(api: Api, pid: str) -> int:
    return sum(o["action"] == "start_compute" for o in api.operations(pid))


def _timed(what: str, step: Any) -> float:
    started = time.monotonic()
    step()
    elapsed = time.monotonic() - started
    # Each step alone takes well under a second; waiting behind the flood would take a deadline.
    assert elapsed < DEADLINE / 2, (what, elapsed)
    return elapsed


def test_a_flood_on_every_door_starves_no_one(walled: Server, owner: Api) -> None:
    project = owner.create_ready_project(name="doors-flood")
    uri = project["connection_uris"][0]["connection_uri"]
    creds = _credentials(uri)
    creds["options"] = f"endpoint={creds.pop('endpoint')}"
    port = walled.proxy_port

    def query() -> None:
        with psycopg.connect(uri, connect_timeout=30) as conn:
            assert conn.execute("select 1").fetchone() == (1,)

    def api() -> None:
        assert owner.http.get(f"/projects/{project['project']['id']}").status_code == 200

    def websocket() -> None:
        assert ws_login(port, **creds) == ("", "")

    def work() -> None:
        _timed("API", api)
        _timed("TCP query", query)
        _timed("WebSocket login", websocket)

    work()  # everything warm before the flood
    flooders = _flooders()
    with Flood(flooders, {"proxy": port}):
        _assert_proxy_refused(_probe(port))  # the flooding address has its share: refused
        work()
        _assert_proxy_refused(_probe(port))
        refused = _exchange(port, _upgrade(), source=FLOODER)  # in HTTP's words, to HTTP
        assert refused.startswith(b"HTTP/1.1 429 "), refused
    outcomes: dict[str, int] = {}
    for f in flooders:
        assert f.closed, f"{f.kind} flooder never closed"
        if f.received.startswith(b"E"):
            _assert_proxy_refused(f.received)
            outcome = "refused"
        elif f.received.startswith(b"HTTP/1.1 429 "):  # an HTTP client past its share
            body = json.loads(f.received.partition(b"\r\n\r\n")[2])
            assert body["code"] == "TOO_MANY_REQUESTS"
            assert f"at most {CAP}" in body["message"]
            outcome = "refused"
        elif f.kind == "slow HTTP head":
            assert f.received.startswith(b"HTTP/1.1 408 "), f.received
            body = json.loads(f.received.partition(b"\r\n\r\n")[2])
            assert body["code"] == "REQUEST_TIMEOUT"
            outcome = "timed out"
        elif f.kind == "silent WebSocket":
            # Upgraded, then closed at the deadline with a closing frame (1000).
            assert f.received.startswith(b"HTTP/1.1 101 "), f.received
            assert f.received.endswith(b"\x88\x02\x03\xe8"), f.received
            outcome = "timed out"
        else:
            assert f.received == b"", (f.kind, f.received)
            outcome = "timed out"
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    assert outcomes.get("refused", 0) >= 1, outcomes
    assert outcomes.get("timed out", 0) >= CAP, outcomes
    assert " ERROR " not in walled.log(), walled.log()[-4000:]


def _exchange(port: int, data: bytes, source: str = "127.0.0.1") -> bytes:
    with socket.create_connection(
        ("127.0.0.1", port), timeout=30, source_address=(source, 0)
    ) as sock:
        sock.sendall(data)
        received = b""
        with contextlib.suppress(ConnectionResetError):
            while chunk := sock.recv(65536):
                received += chunk
        return received


def _json_error(received: bytes, status: int, code: str) -> None:
    assert received.startswith(f"HTTP/1.1 {status} ".encode()), received[:200]
    head, _, body = received.partition(b"\r\n\r\n")
    assert b"content-type: application/json" in head.lower()
    assert json.loads(body)["code"] == code


def test_oversized_heads_bodies_and_frames_are_refused(walled: Server, owner: Api) -> None:
    port = walled.proxy_port
    big_head = b"GET /v2 HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 20_000 + b"\r\n\r\n"
    _json_error(_exchange(port, big_head), 431, "REQUEST_HEADER_FIELDS_TOO_LARGE")
    # Refused on its Content-Length, before a byte of the body is read.
    big_body = b"POST /sql HTTP/1.1\r\nHost: x\r\nContent-Length: 104857600\r\n\r\n"
    _json_error(_exchange(port, big_body), 413, "PAYLOAD_TOO_LARGE")
    _json_error(_exchange(port, b"GET /nowhere HTTP/1.1\r\nHost: x\r\n\r\n"), 404, "NOT_FOUND")
    # On TLS too: the proxy's certificate, HTTP by ALPN.
    ca = ssl.create_default_context(cafile=str(walled.data_dir / "tls" / "ca.crt"))
    r = httpx.get(f"https://127.0.0.1:{port}/nowhere", verify=ca)
    assert (r.status_code, r.json()["code"]) == (404, "NOT_FOUND")

    # Before the login is proven a frame is small (64 KiB): a larger one closes the socket.
    with ws_connect(f"ws://127.0.0.1:{port}/v2", compression=None, max_size=None) as ws:
        ws.send(b"\0" * (1 << 20))
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=30)
    assert closed.value.rcvd is not None
    assert closed.value.rcvd.code == CloseCode.MESSAGE_TOO_BIG


def test_wrong_passwords_on_the_websocket_door_are_throttled_with_tcps(
    walled: Server, owner: Api
) -> None:
    project = owner.create_ready_project(name="doors-throttle")
    pid, eid = project["project"]["id"], project["endpoints"][0]["id"]
    creds = _credentials(project["connection_uris"][0]["connection_uri"])
    creds.pop("endpoint")
    owner.suspend(pid, eid)
    port = walled.proxy_port
    guess = {**creds, "password": "guess", "options": f"endpoint={eid}", "source": FLOODER}
    failed = ("28P01", 'password authentication failed for user "neondb_owner"')

    def attempt() -> tuple[str, str]:
        return ws_login(port, **guess)

    def wrong(answer: tuple[str, str]) -> bool:
        return answer == failed

    refusals = [attempt() for _ in range(30)]
    assert refusals[0] == failed
    throttled = until_throttled(attempt, wrong)
    assert throttled[0] == "08004" and "too many failed logins" in throttled[1], throttled
    # The same allowance on TCP: the door does not matter, the address and endpoint do.
    spend_refill(attempt, wrong)
    tcp = pgclient.refusal(port, source=FLOODER, endpoint=eid, **creds)
    assert tcp is not None and "too many failed logins" in tcp
    # Everyone else logs in; nothing woke before them.
    assert owner.endpoint(pid, eid)["current_state"] == "idle"
    assert ws_login(port, **{**creds, "options": f"endpoint={eid}"}) == ("", "")


def test_an_unauthenticated_websocket_wakes_nothing(walled: Server, owner: Api) -> None:
    project = owner.create_ready_project(name="doors-nowake")
    pid, eid = project["project"]["id"], project["endpoints"][0]["id"]
    creds = _credentials(project["connection_uris"][0]["connection_uri"])
    owner.suspend(pid, eid)
    starts = _starts(owner, pid)
    params = {"user": creds["user"], "database": creds["database"], "options": f"endpoint={eid}"}
    # A startup and no password: asked for it, then closed at the deadline; nothing started.
    with ws_connect(f"ws://127.0.0.1:{walled.proxy_port}/v2", compression=None) as ws:
        ws.send(wire.Startup(wire.PROTOCOL_3, params).encode())
        assert ws.recv(timeout=30) == wire.auth_message(wire.AUTH_CLEARTEXT)
        with pytest.raises(ConnectionClosed):
            ws.recv(timeout=DEADLINE * 3)
    assert owner.endpoint(pid, eid)["current_state"] == "idle"
    assert _starts(owner, pid) == starts


def test_every_door_on_the_one_port(walled: Server, owner: Api) -> None:
    """On the server's own event loop (uvloop): Postgres plain, after SSLRequest and on direct
    TLS (ALPN postgresql), HTTP plain and on TLS (ALPN http/1.1), all on the proxy's port."""
    uri = owner.create_ready_project(name="doors-one-port")["connection_uris"][0]["connection_uri"]
    for mode in ({"sslmode": "disable"}, {"sslmode": "require"}, {"sslnegotiation": "direct"}):
        with psycopg.connect(uri, connect_timeout=30, **mode) as conn:
            assert conn.execute("select 1").fetchone() == (1,)
            assert conn.info.pgconn.ssl_in_use is (mode.get("sslmode") != "disable")
    ca = ssl.create_default_context(cafile=str(walled.data_dir / "tls" / "ca.crt"))
    for scheme, verify in (("http", False), ("https", ca)):
        with httpx.Client(verify=verify) as http:
            r = http.get(f"{scheme}://127.0.0.1:{walled.proxy_port}/nowhere")
            r2 = http.get(f"{scheme}://127.0.0.1:{walled.proxy_port}/other")  # kept alive
        assert (r.status_code, r.json()["code"]) == (404, "NOT_FOUND")
        assert r2.status_code == 404
