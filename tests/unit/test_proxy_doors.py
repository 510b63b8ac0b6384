"""The proxy's doors on one port, against a scripted compute: what a client sends first picks
Postgres (plain, after SSLRequest, direct TLS with ALPN) or HTTP (plain or TLS), and the HTTP
door's bounds and JSON errors. The WebSocket door's login is here too; the real driver meets it
in tests/e2e/test_serverless_ws.py."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import ssl
import struct
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import psycopg
import pytest
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed
from websockets.frames import Frame, Opcode

from pgplane.connlimits import ConnectionGate
from pgplane.proxy import wire
from pgplane.proxy.activity import Activity
from pgplane.proxy.doors.http import HttpLimits, HttpReply, HttpRequest
from pgplane.proxy.doors.sniff import Door, classify, peek
from pgplane.proxy.doors.websocket import WebSocketSide
from pgplane.proxy.doors.wsframes import Frames
from pgplane.proxy.pipe import Side
from pgplane.proxy.scram import ScramError
from pgplane.proxy.seam import RouteError
from pgplane.proxy.server import ALPN, Proxy
from pgplane.proxy.throttle import LoginThrottle
from pgplane.tls import ca_certificate, certificate_hash, ensure_certificate, server_context
from tests.unit.test_proxy_server import (
    AUTH_OK,
    ENDPOINT,
    OWN,
    PASSWORD,
    READY,
    Computes,
    ScriptedCompute,
)

SSL_REQUEST = struct.pack("!II", 8, wire.SSL_REQUEST)


@pytest.mark.parametrize(
    ("first", "door"),
    [
        (wire.Startup(wire.PROTOCOL_3, {"user": "u"}).encode(), Door.POSTGRES),
        (SSL_REQUEST, Door.POSTGRES),
        (struct.pack("!II", 8, wire.GSSENC_REQUEST), Door.POSTGRES),
        (wire.cancel_request(1, b"k" * 4), Door.POSTGRES),
        (b"\x16\x03\x01\x02\x00", Door.TLS),
        (b"GET /v2 HTTP/1.1\r\n", Door.HTTP),
        (b"POST /sql HTTP/1.1\r\n", Door.HTTP),
        (b"OPTIONS * HTTP/1.1\r\n", Door.HTTP),
        (b"get / HTTP/1.1\r\n", Door.POSTGRES),  # not a method: refused as today
        (b"\xff\xff\xff\xff", Door.POSTGRES),
        (b"", Door.POSTGRES),
    ],
)
def test_the_first_byte_picks_the_door(first: bytes, door: Door) -> None:
    assert classify(first[:1]) is door


class Sql:
    def __init__(self, *, refuse: bool = False) -> None:
        self.seen: list[HttpRequest] = []
        self.heads: list[HttpRequest] = []
        self.refuse = refuse

    async def check(self, request: HttpRequest) -> tuple[HttpReply | None, object]:
        self.heads.append(request)
        if self.refuse:
            return HttpReply.error(400, "not you"), None
        return None, "proven"

    async def handle(self, request: HttpRequest) -> HttpReply:
        self.seen.append(request)
        return HttpReply.json(200, {"echo": request.body.decode(), "peer": request.peer})


@contextlib.asynccontextmanager
async def proxied(
    tmp_path: Path, *, sql: Sql | None = None, timeout: float = 30, limits: HttpLimits | None = None
) -> AsyncIterator[tuple[int, Computes, Path]]:
    compute = ScriptedCompute([AUTH_OK + READY])
    server = await asyncio.start_server(compute.serve, "127.0.0.1", 0)
    computes = Computes(server.sockets[0].getsockname()[1], OWN)
    tls = ensure_certificate(tmp_path / "tls", "localhost")
    proxy = Proxy(
        computes=computes,
        activity=Activity(),
        proxy_host="localhost",
        server_tls=server_context(tls, alpn_protocols=ALPN),
        cert_hash=certificate_hash(tls.pair),
        throttle=LoginThrottle(failures_per_minute=3),
        handshake_timeout=timeout,
        sql=sql,
        http_limits=limits,
    )
    [(_, port)] = await proxy.start("127.0.0.1", 0)
    try:
        yield port, computes, ca_certificate(tmp_path / "tls")
    finally:
        await proxy.close()
        server.close()
        await server.wait_closed()


async def _psycopg(port: int, **kwargs: str) -> None:
    conn = await psycopg.AsyncConnection.connect(
        host="127.0.0.1",
        port=port,
        user="u",
        password=PASSWORD,
        dbname="d",
        options=f"endpoint={ENDPOINT}",
        connect_timeout=30,
        **kwargs,
    )
    assert conn.info.backend_pid == 4242
    await conn.close()


async def test_postgres_plain_after_sslrequest_and_direct_tls_share_the_port(
    tmp_path: Path,
) -> None:
    async with proxied(tmp_path) as (port, computes, _):
        await _psycopg(port, sslmode="disable")
        await _psycopg(port, sslmode="require")
        # PostgreSQL 17's direct TLS: a ClientHello first, ALPN "postgresql".
        await _psycopg(port, sslmode="require", sslnegotiation="direct")
        assert computes.routes == 3


async def test_http_plain_and_tls_answer_json_and_keep_the_connection(tmp_path: Path) -> None:
    sql = Sql()
    async with proxied(tmp_path, sql=sql) as (port, _, cert):
        for base, verify in [
            (f"http://127.0.0.1:{port}", False),
            (f"https://127.0.0.1:{port}", True),
        ]:
            ctx = ssl.create_default_context(cafile=str(cert)) if verify else False
            async with httpx.AsyncClient(base_url=base, verify=ctx) as http:
                r = await http.get("/nothing/here")
                assert r.status_code == 404
                assert r.json() == {"code": "NOT_FOUND", "message": "no such path: /nothing/here"}
                # Neon's driver sends JSON as text/plain: the door does not look.
                r = await http.post(
                    "/sql", content=b'{"query": "select 1"}', headers={"content-type": "text/plain"}
                )
                assert r.status_code == 200, r.text
                assert r.json() == {"echo": '{"query": "select 1"}', "peer": "127.0.0.1"}
                r = await http.get("/v2")
                assert r.status_code == 426
                assert r.json()["code"] == "UPGRADE_REQUIRED"
        assert [s.tls for s in sql.seen] == [False, True]


async def test_sql_unplugged_is_a_404_like_any_unknown_path(tmp_path: Path) -> None:
    async with (
        proxied(tmp_path) as (port, _, _),
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http,
    ):
        r = await http.post("/sql", content=b"{}")
        assert r.status_code == 404
        assert r.json()["code"] == "NOT_FOUND"


async def _raw_exchange(port: int, data: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    await writer.drain()
    reply = await asyncio.wait_for(reader.read(), 30)
    writer.close()
    return reply


async def test_oversized_heads_and_bodies_are_refused_with_json(tmp_path: Path) -> None:
    limits = HttpLimits(max_head=4096, max_body=1000, request_seconds=30)
    async with proxied(tmp_path, sql=Sql(), limits=limits) as (port, _, _):
        big_head = b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 8000 + b"\r\n\r\n"
        reply = await _raw_exchange(port, big_head)
        assert reply.startswith(b"HTTP/1.1 431 "), reply[:100]
        assert b'"code": "REQUEST_HEADER_FIELDS_TOO_LARGE"' in reply
        big_body = b"POST /sql HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n\r\n"
        reply = await _raw_exchange(port, big_body)
        assert reply.startswith(b"HTTP/1.1 413 "), reply[:100]
        chunked = b"POST /sql HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        chunked += b"400\r\n" + b"x" * 1024 + b"\r\n0\r\n\r\n"
        reply = await _raw_exchange(port, chunked)
        assert reply.startswith(b"HTTP/1.1 413 "), reply[:100]
        reply = await _raw_exchange(port, b"GARBAGE\r\n\r\n")
        assert reply.startswith(b"HTTP/1.1 400 "), reply[:100]
        assert b'"code": "BAD_REQUEST"' in reply


async def test_a_silent_or_slow_client_meets_the_deadline(tmp_path: Path) -> None:
    async with proxied(tmp_path, timeout=1) as (port, _, _):
        loop = asyncio.get_running_loop()
        # Silent: closed without a word.
        started = loop.time()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        assert await asyncio.wait_for(reader.read(), 10) == b""
        assert loop.time() - started < 5
        writer.close()
        # Half a request: a 408, in JSON.
        reply = await _raw_exchange(port, b"POST /sql HTTP/1.1\r\nHost: x\r\n")
        assert reply.startswith(b"HTTP/1.1 408 "), reply[:100]
        assert b'"code": "REQUEST_TIMEOUT"' in reply


async def _ws_login(port: int, password: str, *, host: str | None = None) -> bytes:
    headers = {"Host": host} if host else None
    async with ws_connect(
        f"ws://127.0.0.1:{port}/v2", additional_headers=headers, compression=None
    ) as ws:
        startup = wire.Startup(
            wire.PROTOCOL_3, {"user": "u", "database": "d", "options": f"endpoint={ENDPOINT}"}
        )
        # As the driver does: startup and password at once, without waiting.
        await ws.send(startup.encode())
        await ws.send(wire.password_message(password.encode() + b"\0"))
        received = b""
        with contextlib.suppress(ConnectionClosed):
            while b"Z\0\0\0\x05" not in received and not received.startswith(
                b"R\0\0\0\x08\0\0\0\x03E"
            ):
                message = await asyncio.wait_for(ws.recv(), 30)
                assert isinstance(message, bytes)
                received += message
        return received


async def test_the_websocket_door_asks_for_a_cleartext_password(tmp_path: Path) -> None:
    async with proxied(tmp_path) as (port, computes, _):
        received = await _ws_login(port, PASSWORD)
        assert received.startswith(wire.auth_message(wire.AUTH_CLEARTEXT) + AUTH_OK)
        assert received.endswith(READY)
        assert computes.routes == 1
        refused = await _ws_login(port, "wrong")
        assert b"28P01" in refused
        assert computes.wakes == []


def test_classify_sees_only_the_first_byte() -> None:
    # A Postgres packet's length is below 10 000: its first byte is always 0.
    assert all(
        classify(struct.pack("!I", n)[:1]) is Door.POSTGRES for n in (8, 9999, wire.MAX_STARTUP)
    )


def test_peek_leaves_the_bytes_on_the_socket() -> None:
    a, b = socket.socketpair()
    with a, b:
        b.setblocking(False)
        a.sendall(b"\x16\x03")
        assert asyncio.run(peek(b, 1)) == b"\x16"
        assert b.recv(2) == b"\x16\x03"


class _Transport:
    """A transport that records what is written and whether reading is paused."""

    def __init__(self) -> None:
        self.paused = False
        self.written = b""
        self.closed = False

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False

    def is_closing(self) -> bool:
        return self.closed

    def write(self, data: bytes) -> None:
        self.written += data

    def close(self) -> None:
        self.closed = True

    def set_write_buffer_limits(self, high: int) -> None:
        pass

    def set_protocol(self, protocol: object) -> None:
        pass

    def get_extra_info(self, name: str) -> None:
        return None


async def test_a_websocket_pipe_pauses_the_side_that_outruns_the_other() -> None:
    client_transport, compute_transport = _Transport(), _Transport()
    raw = Side()
    raw.connection_made(client_transport)  # type: ignore[arg-type]
    client = WebSocketSide.take_over(raw, Frames(max_frame=1 << 20), b"HTTP/1.1 101 \r\n\r\n", b"")
    compute = Side()
    compute.connection_made(compute_transport)  # type: ignore[arg-type]
    session = Activity().open(ENDPOINT, 0)
    compute.pipe_to(client, session)
    client.pipe_to(compute, session)

    # Frames in, bytes out; bytes in, binary frames out.
    client.data_received(Frame(Opcode.BINARY, b"query").serialize(mask=True, extensions=[]))
    assert compute_transport.written == b"query"
    compute.data_received(b"rows")
    assert client_transport.written.endswith(Frame(Opcode.BINARY, b"rows").serialize(mask=False))

    # The compute's buffer fills (the compute reads slowly): the client is paused, and resumed.
    compute.pause_writing()
    assert client_transport.paused
    compute.resume_writing()
    assert not client_transport.paused
    # The client's buffer fills (the client reads slowly): the compute is paused, and resumed.
    client.pause_writing()
    assert compute_transport.paused
    client.resume_writing()
    assert not compute_transport.paused

    # A text frame is no Postgres: the connection is closed (1003).
    client.data_received(Frame(Opcode.TEXT, b"select 1").serialize(mask=True, extensions=[]))
    assert client_transport.closed


async def test_a_handler_logs_in_with_a_password_through_the_same_walls(tmp_path: Path) -> None:
    compute = ScriptedCompute([AUTH_OK + READY])
    server = await asyncio.start_server(compute.serve, "127.0.0.1", 0)
    computes = Computes(server.sockets[0].getsockname()[1], OWN)
    proxy = Proxy(
        computes=computes,
        activity=Activity(),
        proxy_host="localhost",
        server_tls=None,
        cert_hash=None,
        throttle=LoginThrottle(failures_per_minute=3),
    )
    startup = wire.Startup(wire.PROTOCOL_3, {"user": "u", "database": "d"})
    try:
        conn, reply = await proxy.sessions.open_with_password(
            ENDPOINT, startup, PASSWORD, peer="127.0.0.1"
        )
        assert reply == AUTH_OK + READY
        conn.close()
        for _ in range(3):
            with pytest.raises(ScramError, match='password authentication failed for user "u"'):
                await proxy.sessions.open_with_password(ENDPOINT, startup, "x", peer="127.0.0.2")
        with pytest.raises(RouteError, match="too many failed logins"):
            await proxy.sessions.open_with_password(ENDPOINT, startup, PASSWORD, peer="127.0.0.2")
        assert computes.wakes == []
        assert compute.connections == 1
    finally:
        await proxy.close()
        server.close()
        await server.wait_closed()


async def test_past_the_caps_each_door_is_told_in_its_own_words(tmp_path: Path) -> None:
    compute = ScriptedCompute([AUTH_OK + READY])
    server = await asyncio.start_server(compute.serve, "127.0.0.1", 0)
    computes = Computes(server.sockets[0].getsockname()[1], OWN)
    tls = ensure_certificate(tmp_path / "tls", "localhost")
    proxy = Proxy(
        computes=computes,
        activity=Activity(),
        proxy_host="localhost",
        server_tls=server_context(tls, alpn_protocols=ALPN),
        cert_hash=certificate_hash(tls.pair),
        gate=ConnectionGate(per_address=1, total=0),
    )
    [(_, port)] = await proxy.start("127.0.0.1", 0)
    try:
        _, holder = await asyncio.open_connection("127.0.0.1", port)  # the address' one place
        http = await _raw_exchange(port, b"GET /v2 HTTP/1.1\r\nHost: x\r\n\r\n")
        assert http.startswith(b"HTTP/1.1 429 "), http
        assert b"Retry-After: 1\r\n" in http
        body = json.loads(http.partition(b"\r\n\r\n")[2])
        assert body == {"code": "TOO_MANY_REQUESTS", "message": body["message"]}
        assert "at most 1" in body["message"]
        postgres = await _raw_exchange(port, SSL_REQUEST)
        assert postgres.startswith(b"E") and b"C53300\0" in postgres, postgres
        silent = await _raw_exchange(port, b"")
        assert silent.startswith(b"E") and b"C53300\0" in silent, silent
        # TLS is not started for a client past the caps: it is closed.
        assert await _raw_exchange(port, b"\x16\x03\x01\x00\x05hello") == b""
        holder.close()
    finally:
        await proxy.close()
        server.close()
        await server.wait_closed()
