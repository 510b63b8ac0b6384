"""A piped session through the real proxy, whose chunks go from the loop's read callback
straight into the peer's write (proxy/pipe.py): queries, results and COPY larger than every
buffer on the way; bytes a client sent before its session was piped reach the compute first, in
order; the compute's bytes alone count as activity for idle suspend; a suspend closes the client
and frees its place; a client that half-closes, or vanishes mid-result, ends its backend; a
client that stops reading holds its backend, not the proxy's memory.
"""

from __future__ import annotations

import re
import socket
import struct
import time
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import httpx
import psycopg
import pytest

from tests import pgclient
from tests.support import Api, Server, plaintext, wait_for

ROWS = 30_000  # rows of 1000 bytes: a result of 30 MB


class Path:
    """The server, and a project on it."""

    def __init__(self, name: str, server: Server, api: Api) -> None:
        self.name = name
        self.server = server
        body = api.create_ready_project(name=f"pipe-{name}")
        self.project_id = body["project"]["id"]
        self.endpoint_id = body["endpoints"][0]["id"]
        self.uri = plaintext(body["connection_uris"][0]["connection_uri"])
        params = body["connection_uris"][0]["connection_parameters"]
        self.role, self.password = params["role"], params["password"]
        self.api = api

    def metric(self, name: str) -> float:
        text = httpx.get(f"http://127.0.0.1:{self.server.port}/metrics", timeout=10).text
        found = re.search(rf"^{name} (\S+)$", text, re.MULTILINE)
        assert found, f"{name} not in /metrics"
        return float(found.group(1))

    def open_sessions(self) -> float:
        return self.metric("pgplane_proxy_open_connections")

    def login(self) -> socket.socket:
        """A raw client past SCRAM, the compute's replies (AuthenticationOk on) unread."""
        login = pgclient.login(
            self.server.proxy_port, endpoint=self.endpoint_id, user=self.role,
            password=self.password,
        )  # fmt: skip
        assert login.error is None, login.error
        return login.sock

    def backends(self) -> int:
        """Client backends on the compute other than the asking one."""
        with psycopg.connect(self.uri, autocommit=True, connect_timeout=30) as conn:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()"
            ).fetchone()
        assert row is not None
        return int(row[0])


@pytest.fixture(scope="module")
def path(server: Server) -> Iterator[Path]:
    _, key = server.create_key("proxy-pipe@example.com")
    with Api(server, key) as api:
        yield Path("pipe", server, api)


def _message(sock: socket.socket) -> tuple[bytes, bytes]:
    header = _exactly(sock, 5)
    (length,) = struct.unpack("!I", header[1:])
    return header[:1], _exactly(sock, length - 4)


def _exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise EOFError(f"closed after {len(data)} of {n} bytes")
        data += chunk
    return data


def _kinds(data: bytes) -> list[bytes]:
    """The kinds of the whole messages ``data`` is made of (AssertionError on a torn one)."""
    kinds, at = [], 0
    while at < len(data):
        assert at + 5 <= len(data), f"a torn message at {at}: {data!r}"
        (length,) = struct.unpack("!I", data[at + 1 : at + 5])
        assert at + 1 + length <= len(data), f"a torn message at {at}: {data!r}"
        kinds.append(data[at : at + 1])
        at += 1 + length
    return kinds


def _query(sql: str) -> bytes:
    payload = sql.encode() + b"\0"
    return b"Q" + struct.pack("!I", len(payload) + 4) + payload


def _rows_until_ready(sock: socket.socket) -> list[bytes]:
    """The first column of each DataRow up to the next ReadyForQuery."""
    rows = []
    while True:
        kind, payload = _message(sock)
        if kind == b"Z":
            return rows
        if kind == b"E":
            raise AssertionError(f"error: {payload!r}")
        if kind == b"D":
            (size,) = struct.unpack("!i", payload[2:6])
            rows.append(payload[6 : 6 + size])


def test_queries_results_and_copy_larger_than_every_buffer(path: Path) -> None:
    with psycopg.connect(path.uri, autocommit=True, connect_timeout=30) as conn:
        for i in range(300):
            assert conn.execute("SELECT %s::int * 2", (i,)).fetchone() == (2 * i,)
        rows = conn.execute(
            "SELECT g, repeat(chr(65 + g %% 26), 1000) FROM generate_series(1, %s) g", (ROWS,)
        ).fetchall()
        assert [r[0] for r in rows] == list(range(1, ROWS + 1))
        assert all(r[1] == chr(65 + r[0] % 26) * 1000 for r in rows)
        conn.execute("CREATE TEMP TABLE t (n int, s text)")
        sent = b"".join(f"{n}\t{'z' * 2000}{n}\n".encode() for n in range(10_000))
        with conn.cursor().copy("COPY t FROM STDIN") as copy:
            copy.write(sent)
        got = bytearray()
        with conn.cursor().copy("COPY (SELECT * FROM t ORDER BY n) TO STDOUT") as copy:
            for chunk in copy:
                got += chunk
        assert bytes(got) == sent


def test_bytes_sent_before_the_session_is_piped_arrive_first_and_in_order(path: Path) -> None:
    sock = path.login()
    with sock:
        # Sent while the proxy logs in to the compute: held by the proxy, then passed on first.
        sock.sendall(b"".join(_query(f"SELECT {n}") for n in range(1, 6)))
        kind, payload = _message(sock)
        assert (kind, payload[:4]) == (b"R", b"\0\0\0\0"), (kind, payload)  # AuthenticationOk
        _rows_until_ready(sock)  # the compute's parameters and key, then ReadyForQuery
        assert [_rows_until_ready(sock) for _ in range(5)] == [[b"%d" % n] for n in range(1, 6)]
        sock.sendall(_query("SELECT 'after'"))
        assert _rows_until_ready(sock) == [b"after"]


def test_the_compute_s_bytes_alone_count_as_activity(path: Path) -> None:
    with psycopg.connect(path.uri, autocommit=True, connect_timeout=30) as conn:
        notices: list[float] = []
        conn.add_notice_handler(lambda _: notices.append(time.time()))
        asked = time.time()
        # One message from the client; then only the compute speaks, for four seconds.
        conn.execute(
            "DO $$ BEGIN FOR i IN 1..8 LOOP RAISE NOTICE 'tick %', i;"
            " PERFORM pg_sleep(0.5); END LOOP; END $$"
        )
    assert len(notices) == 8
    path.server.wait_for_ticks(2)
    seen = path.api.endpoint(path.project_id, path.endpoint_id)["last_active"]
    last_active = datetime.fromisoformat(seen.replace("Z", "+00:00")).timestamp()
    assert last_active >= int(asked) + 2, (seen, asked)


def test_a_suspend_closes_the_client_and_frees_its_place(path: Path) -> None:
    base = path.open_sessions()
    conn = psycopg.connect(path.uri, autocommit=True, connect_timeout=30)
    try:
        assert conn.execute("SELECT 1").fetchone() == (1,)
        wait_for("the session open", lambda: path.open_sessions() == base + 1)
        path.api.suspend(path.project_id, path.endpoint_id)
        with pytest.raises(psycopg.OperationalError):
            conn.execute("SELECT 1")
    finally:
        conn.close()
    wait_for("the session gone", lambda: path.open_sessions() == base)
    with psycopg.connect(path.uri, autocommit=True, connect_timeout=30) as again:
        assert again.execute("SELECT 2").fetchone() == (2,)  # woken again


def test_a_client_that_half_closes_ends_its_session(path: Path) -> None:
    base = path.open_sessions()
    sock = path.login()
    with sock:
        _message(sock)
        _rows_until_ready(sock)
        sock.sendall(_query("SELECT 42"))
        sock.shutdown(socket.SHUT_WR)
        got = b""
        while chunk := sock.recv(65536):  # the proxy closes: no hang (timeout 30 s)
            got += chunk
    # Whatever came before the end came whole and in order: the reply, or none of it.
    assert _kinds(got) in ([], [b"T", b"D", b"C", b"Z"]), got
    wait_for("the session gone", lambda: path.open_sessions() == base)
    wait_for("its backend gone", lambda: path.backends() == 0)


def test_a_client_gone_mid_result_ends_its_backend(path: Path) -> None:
    base = path.open_sessions()
    sock = path.login()
    with sock:
        _message(sock)
        _rows_until_ready(sock)
        sock.sendall(_query("SELECT repeat('x', 1000) FROM generate_series(1, 300000)"))
        assert len(_exactly(sock, 100_000)) == 100_000
        # Reset, not a polite close: SO_LINGER 0.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    wait_for("the session gone", lambda: path.open_sessions() == base)
    wait_for("its backend gone", lambda: path.backends() == 0)


def _rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_a_client_that_stops_reading_holds_its_backend_not_the_proxy(path: Path) -> None:
    assert path.server.process is not None
    rss = _rss_kib(path.server.process.pid)
    sock = path.login()
    with sock:
        _message(sock)
        _rows_until_ready(sock)
        # 300 MB the client will not read: the compute must wait, writing to its client.
        sock.sendall(_query("SELECT repeat('y', 1000000) FROM generate_series(1, 300)"))

        def waiting() -> Any:
            with psycopg.connect(path.uri, autocommit=True, connect_timeout=30) as conn:
                row = conn.execute(
                    "SELECT wait_event FROM pg_stat_activity WHERE backend_type = 'client backend'"
                    " AND pid <> pg_backend_pid() AND query LIKE 'SELECT repeat(''y''%'"
                ).fetchone()
                return row is not None and row[0] == "ClientWrite"

        wait_for("the backend held by its client", waiting)
        with psycopg.connect(path.uri, autocommit=True, connect_timeout=30) as other:
            assert other.execute("SELECT 'others go on'").fetchone() == ("others go on",)
        # The proxy holds at most its buffers' worth of the 300 MB.
        assert _rss_kib(path.server.process.pid) - rss < 32 * 1024
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    wait_for("its backend gone", lambda: path.backends() == 0)
