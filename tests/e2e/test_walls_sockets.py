"""Silent and slow sockets on both listeners starve no one (issue 12: descriptor hygiene).

One address (127.0.0.2) floods the API and the proxy with more connections than its share:
sockets that send nothing, HTTP headers (or a body) a byte a second, a Postgres startup a byte a
second. Meanwhile a client from 127.0.0.1 uses the API, gets ``/readyz`` 200 and runs a query
through the proxy. The flooders past the cap are refused at once with the listener's error; the
others are closed at their deadline; afterwards the server holds no more descriptors than before.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import resource
import socket
import struct
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import psycopg
import pytest

from tests.support import Api, Server, running_server

CAP = 6  # connections per address on each listener
FLOOD = 3 * CAP  # connections the flooding address opens on each listener
DEADLINE = 4  # seconds: header, body, idle and proxy handshake deadlines
FLOODER = "127.0.0.2"  # the whole 127/8 is loopback on Linux
GIVE_UP = 60.0  # a flooder still open after this long is a failure, and the flood ends anyway
SLACK = 8  # descriptors the server may hold beyond its baseline after the flood (store, logs)


LOW_SOFT_LIMIT = 1024  # what the server is started under: the usual default soft limit


@contextlib.contextmanager
def _low_soft_limit() -> Iterator[None]:
    """Children started meanwhile inherit a soft descriptor limit below the hard one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard <= LOW_SOFT_LIMIT:
        pytest.skip(f"the hard descriptor limit is {hard}: nothing to raise")
    resource.setrlimit(resource.RLIMIT_NOFILE, (LOW_SOFT_LIMIT, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.fixture(scope="module")
def walled() -> Iterator[Server]:
    with contextlib.ExitStack() as stack:
        with _low_soft_limit():  # which the server raises itself
            srv = stack.enter_context(
                running_server(
                    PGPLANE_API_CONNECTIONS_PER_ADDRESS=str(CAP),
                    PGPLANE_API_MAX_CONNECTIONS="64",
                    PGPLANE_PROXY_CONNECTIONS_PER_ADDRESS=str(CAP),
                    PGPLANE_PROXY_MAX_CONNECTIONS="64",
                    PGPLANE_HTTP_HEADER_TIMEOUT_SECONDS=str(DEADLINE),
                    PGPLANE_HTTP_BODY_TIMEOUT_SECONDS=str(DEADLINE),
                    PGPLANE_HTTP_IDLE_TIMEOUT_SECONDS=str(DEADLINE),
                    PGPLANE_PROXY_HANDSHAKE_TIMEOUT_SECONDS=str(DEADLINE),
                )
            )
        yield srv


def _startup(user: str, database: str) -> bytes:
    params = f"user\0{user}\0database\0{database}\0\0".encode()
    return struct.pack("!II", 8 + len(params), 196608) + params


@dataclass
class Flooder:
    listener: str  # "api" or "proxy"
    kind: str  # "silent", "slow headers", "slow body", "slow startup"
    first: bytes  # sent at once
    drip: bytes  # then a byte a second
    received: bytes = b""
    closed: bool = False


class Flood:
    """Flooders from FLOODER, run on an event loop of their own in a thread; all end by
    themselves (closed by the server, or GIVE_UP)."""

    def __init__(self, flooders: list[Flooder], ports: dict[str, int]) -> None:
        self.flooders = flooders
        self._ports = ports
        self.connected = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    def __enter__(self) -> Flood:
        self._thread.start()
        assert self.connected.wait(60), "the flood never connected"
        return self

    def __exit__(self, *exc: object) -> None:
        self._thread.join(GIVE_UP + 30)
        assert not self._thread.is_alive(), "the flood did not end"

    async def _run(self) -> None:
        tasks = []
        for flooder in self.flooders:  # one at a time: the server accepts them in this order
            reader, writer = await self._connect(self._ports[flooder.listener])
            tasks.append(asyncio.create_task(self._flood(flooder, reader, writer)))
        self.connected.set()
        await asyncio.gather(*tasks)

    async def _connect(self, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        sock = socket.socket()
        sock.bind((FLOODER, 0))
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
        return await asyncio.open_connection(sock=sock)

    async def _flood(
        self, flooder: Flooder, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        async def drip() -> None:
            with contextlib.suppress(OSError):
                writer.write(flooder.first)
                for byte in flooder.drip:
                    await asyncio.sleep(1)
                    writer.write(bytes([byte]))

        dripping = asyncio.create_task(drip())
        try:
            async with asyncio.timeout(GIVE_UP):
                while chunk := await reader.read(65536):
                    flooder.received += chunk
            flooder.closed = True
        except ConnectionResetError:
            flooder.closed = True
        except TimeoutError:
            pass
        finally:
            dripping.cancel()
            writer.close()


def _flooders(key: str) -> list[Flooder]:
    head = b"GET /api/v2/projects HTTP/1.1\r\nHost: pgplane\r\nX-Slow: " + b"x" * 60
    post = (
        f"POST /api/v2/projects HTTP/1.1\r\nHost: pgplane\r\nAuthorization: Bearer {key}\r\n"
        "Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
    ).encode()
    api = [
        Flooder("api", "silent", b"", b""),
        Flooder("api", "slow headers", b"", head),
        Flooder("api", "slow body", post, b'{"project": {"name": "' + b"x" * 60),
    ]
    startup = _startup("neondb_owner", "neondb")
    proxy = [
        Flooder("proxy", "silent", b"", b""),
        Flooder("proxy", "slow startup", b"", startup),
    ]
    out = []
    for i in range(FLOOD):  # interleaved: every kind among the admitted ones
        out += [api[i % len(api)], proxy[i % len(proxy)]]
    return [Flooder(f.listener, f.kind, f.first, f.drip) for f in out]


def _probe(port: int) -> bytes:
    """What one more connection from the flooding address is told at once (b"" if nothing)."""
    return _probe_from(FLOODER, port)


def _probe_from(address: str, port: int) -> bytes:
    with socket.socket() as sock:
        sock.bind((address, 0))
        sock.settimeout(10)  # refused connections are answered without waiting for anything
        sock.connect(("127.0.0.1", port))
        received = b""
        with contextlib.suppress(TimeoutError, ConnectionResetError):
            while chunk := sock.recv(65536):
                received += chunk
        return received


def _http(received: bytes) -> tuple[int, dict[str, str], dict[str, str]]:
    assert received, "no answer"
    head, _, body = received.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), headers, json.loads(body)


def _assert_api_refused(received: bytes) -> None:
    assert received.startswith(b"HTTP/1.1 "), received or "no answer: the connection was admitted"
    status, headers, body = _http(received)
    assert status == 429, received
    assert headers["retry-after"] == "1"
    assert body["code"] == "TOO_MANY_REQUESTS"
    assert f"at most {CAP}" in body["message"]


def _assert_proxy_refused(received: bytes) -> None:
    assert received[:1] == b"E", received or "no answer: the connection was admitted"
    assert b"C53300\0" in received, received
    assert f"at most {CAP}".encode() in received


def _descriptors(server: Server) -> int:
    assert server.process is not None
    return len(os.listdir(f"/proc/{server.process.pid}/fd"))


def _wait_for_descriptors(server: Server, at_most: int) -> int:
    deadline = time.monotonic() + 60
    while (count := _descriptors(server)) > at_most and time.monotonic() < deadline:
        time.sleep(0.2)
    return count


def test_the_descriptor_limit_is_raised_to_the_hard_limit(walled: Server) -> None:
    assert walled.process is not None
    limits = Path(f"/proc/{walled.process.pid}/limits").read_text()
    soft, hard = next(line for line in limits.splitlines() if line.startswith("Max open files"))[
        len("Max open files") :
    ].split()[:2]
    assert soft == hard, limits
    assert f"descriptor limit raised from {LOW_SOFT_LIMIT} to {hard}" in walled.log()


def test_a_flood_of_silent_and_slow_sockets_starves_no_one(walled: Server) -> None:
    _, key = walled.create_key("walls@example.com")
    with Api(walled, key) as api:
        uri = api.create_ready_project()["connection_uris"][0]["connection_uri"]
    auth = {"Authorization": f"Bearer {key}"}

    def work() -> None:
        """What the client from 127.0.0.1 does: each on a fresh connection."""
        assert httpx.get(f"{walled.base_url}/projects", headers=auth).status_code == 200
        ready = httpx.get(f"http://127.0.0.1:{walled.port}/readyz")
        assert ready.status_code == 200, ready.text
        with psycopg.connect(uri, connect_timeout=30) as conn:
            assert conn.execute("select 1").fetchone() == (1,)

    work()  # the compute runs and every pool is warm before the baseline
    baseline = _descriptors(walled)
    flooders = _flooders(key)
    with Flood(flooders, {"api": walled.port, "proxy": walled.proxy_port}):
        # The flooding address has its share of both listeners: one more is refused at once...
        _assert_api_refused(_probe(walled.port))
        _assert_proxy_refused(_probe(walled.proxy_port))
        during = _descriptors(walled)
        work()  # ...while another client is served,
        # ...and the flood was still in place all along.
        _assert_api_refused(_probe(walled.port))
        _assert_proxy_refused(_probe(walled.proxy_port))
    assert during >= baseline + CAP  # the flood did hold the server's descriptors

    seen: dict[tuple[str, str], int] = {}
    for f in flooders:
        assert f.closed, f"{f.listener} {f.kind} flooder never closed"
        if f.listener == "api" and f.received.startswith(b"HTTP/1.1 429"):
            _assert_api_refused(f.received)
            outcome = "refused"
        elif f.listener == "proxy" and f.received:
            _assert_proxy_refused(f.received)
            outcome = "refused"
        elif f.kind in ("slow headers", "slow body"):
            # Begun and not finished: told so at the deadline.
            status, _, body = _http(f.received)
            assert (status, body["code"]) == (408, "REQUEST_TIMEOUT"), f.received
            part = "headers" if f.kind == "slow headers" else "body"
            assert f"the {part} did not arrive within {DEADLINE} s" in body["message"]
            outcome = "timed out"
        else:  # silent, or a Postgres startup never finished: closed without a word
            assert f.received == b"", (f.kind, f.received)
            outcome = "timed out"
        seen[f.listener, outcome] = seen.get((f.listener, outcome), 0) + 1
    for listener in ("api", "proxy"):
        # Each address had its share of both; the rest was refused.
        assert seen.get((listener, "refused"), 0) >= 1, seen
        assert seen.get((listener, "timed out"), 0) >= CAP, seen

    work()  # the flood leaves nothing behind that bothers the next client
    count = _wait_for_descriptors(walled, baseline + SLACK)
    print("DEBUG", seen, baseline, during, count)
    print(walled.log()[-6000:])
    assert count <= baseline + SLACK, (baseline, count)
    # Strangers' slowness is theirs: nothing of it is logged as the server's error.
    assert " ERROR " not in walled.log(), walled.log()[-4000:]


def _until_closed(sock: socket.socket, drip: bytes = b"") -> bytes:
    """Everything ``sock`` receives until the server closes it, sending ``drip`` a byte a second
    meanwhile; bounded."""
    sock.settimeout(1)
    received = b""
    for i in range(int(GIVE_UP)):
        with contextlib.suppress(OSError):
            if i < len(drip):
                sock.sendall(drip[i : i + 1])
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            continue
        except ConnectionResetError:
            return received
        if not chunk:
            return received
        received += chunk
    raise AssertionError(f"never closed; received {received!r}")


def test_idle_and_blank_line_connections_are_closed(walled: Server) -> None:
    # Kept alive after an answer, then silent: closed at the idle deadline, without a word more.
    with socket.create_connection(("127.0.0.1", walled.port)) as sock:
        sock.sendall(b"GET /livez HTTP/1.1\r\nHost: pgplane\r\n\r\n")
        received = _until_closed(sock)
    assert received.startswith(b"HTTP/1.1 200"), received
    assert received.count(b"HTTP/1.1") == 1, received
    # Blank lines, which begin no request but stopped uvicorn's keep-alive timer for good: closed
    # at the header deadline, and not told of a request it never began.
    with socket.create_connection(("127.0.0.1", walled.port)) as sock:
        sock.sendall(b"GET /livez HTTP/1.1\r\nHost: pgplane\r\n\r\n")
        received = _until_closed(sock, drip=b"\r\n" * int(GIVE_UP))
    assert received.count(b"HTTP/1.1") == 1, received


def test_past_the_total_cap_everyone_is_refused(walled: Server) -> None:
    flood = []
    try:
        for listener in (walled.port, walled.proxy_port):
            # 66 silent connections from 11 addresses, each within its share: past the total (64).
            for n in range(66):
                sock = socket.socket()
                flood.append(sock)
                sock.bind((f"127.0.1.{n // CAP + 1}", 0))
                sock.connect(("127.0.0.1", listener))
        # A real client, whose request is sent before the refusal is read, gets it whole.
        stranger = httpx.HTTPTransport(local_address="127.0.2.1", retries=0)
        with httpx.Client(transport=stranger, timeout=10) as client:
            refused = client.get(f"http://127.0.0.1:{walled.port}/readyz")
        assert (refused.status_code, refused.headers["retry-after"]) == (503, "1")
        assert refused.json()["code"] == "SERVICE_UNAVAILABLE"
        assert "at its limit of 64" in refused.json()["message"]
        refused = _probe_from("127.0.2.1", walled.proxy_port)
        assert b"C53300\0" in refused, refused
        assert b"at its limit of 64" in refused
    finally:
        for sock in flood:
            sock.close()
    # Places come back as connections end.
    deadline = time.monotonic() + 60
    while (ready := httpx.get(f"http://127.0.0.1:{walled.port}/readyz")).status_code != 200:
        assert time.monotonic() < deadline, ready.text
        time.sleep(0.1)
