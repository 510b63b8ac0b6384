"""The HTTP door's reading of requests (httptools) at its edges: pipelined requests answered in
order and few, a head that dribbles in past its bound, smuggling shapes, HTTP/1.0, keep-alive
and ``Expect: 100-continue``; each answered in JSON or closed, never hung."""

from __future__ import annotations

import asyncio
from pathlib import Path

from pgplane.proxy.doors.http import HttpLimits
from tests.unit.test_proxy_doors import Sql, proxied


async def _exchange(port: int, *parts: bytes, pause: float = 0.0) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    for part in parts:
        writer.write(part)
        await writer.drain()
        if pause:
            await asyncio.sleep(pause)  # a slow client, not a synchronisation
    writer.write_eof()
    reply = await asyncio.wait_for(reader.read(), 30)
    writer.close()
    return reply


def _post(body: bytes, *, extra: bytes = b"") -> bytes:
    head = b"POST /sql HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n" % len(body)
    return head + extra + b"\r\n" + body


async def test_pipelined_requests_are_answered_in_order_and_few(tmp_path: Path) -> None:
    sql = Sql()
    async with proxied(tmp_path, sql=sql) as (port, _, _):
        reply = await _exchange(port, _post(b"one") + _post(b"two") + _post(b"three"))
        assert reply.count(b"HTTP/1.1 200 OK\r\n") == 3
        assert [r.body for r in sql.seen] == [b"one", b"two", b"three"]
        # More than a few read ahead of the one being answered: refused, and closed.
        reply = await _exchange(port, b"".join(_post(b"%d" % i) for i in range(20)))
        assert b"HTTP/1.1 400 " in reply
        assert b"too many requests pipelined" in reply


async def test_a_head_that_dribbles_in_is_bounded(tmp_path: Path) -> None:
    limits = HttpLimits(max_head=4096, max_body=1000, request_seconds=30)
    async with proxied(tmp_path, sql=Sql(), limits=limits) as (port, _, _):
        parts = [b"POST /sql HTTP/1.1\r\nHost: x\r\nX-Long: "] + [b"a" * 1000] * 8
        reply = await _exchange(port, *parts, pause=0.01)
        assert reply.startswith(b"HTTP/1.1 431 "), reply[:100]


async def test_smuggling_shapes_are_refused(tmp_path: Path) -> None:
    async with proxied(tmp_path, sql=Sql()) as (port, _, _):
        both = _post(b"0\r\n\r\n", extra=b"Transfer-Encoding: chunked\r\n")
        assert (await _exchange(port, both)).startswith(b"HTTP/1.1 400 ")
        twice = _post(b"ab", extra=b"Content-Length: 3\r\n")
        assert (await _exchange(port, twice)).startswith(b"HTTP/1.1 400 ")
        folded = b"POST /sql HTTP/1.1\r\nHost: x\r\nX-A: b\r\n c\r\nContent-Length: 0\r\n\r\n"
        assert (await _exchange(port, folded)).startswith(b"HTTP/1.1 400 ")


async def test_http_1_0_is_closed_after_its_reply_and_100_continue_is_sent(
    tmp_path: Path,
) -> None:
    sql = Sql()
    async with proxied(tmp_path, sql=sql) as (port, _, _):
        reply = await _exchange(port, b"POST /sql HTTP/1.0\r\nContent-Length: 2\r\n\r\nhi")
        assert reply.startswith(b"HTTP/1.1 200 OK\r\n")
        assert b"Connection: close\r\n" in reply and b"Keep-Alive" not in reply
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(
            b"POST /sql HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nExpect: 100-continue\r\n\r\n"
        )
        assert await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30) == (
            b"HTTP/1.1 100 Continue\r\n\r\n"
        )
        writer.write(b"ok")
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
        assert head.startswith(b"HTTP/1.1 200 OK\r\n")
        # Kept alive, saying how long it stays so (the door's request_seconds, 30 by default).
        assert b"\r\nKeep-Alive: timeout=30\r\n" in head and b"Connection" not in head
        writer.close()
        assert sql.seen[-1].body == b"ok"
        # Judged by its head before its body was asked for, and the ticket handed on.
        assert sql.seen[-1].ticket == "proven" and sql.heads[-1].body == b""


async def test_a_head_refused_is_answered_before_its_body_and_never_told_to_continue(
    tmp_path: Path,
) -> None:
    sql = Sql(refuse=True)
    async with proxied(tmp_path, sql=sql) as (port, _, _):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(
            b"POST /sql HTTP/1.1\r\nHost: x\r\nContent-Length: 9000000\r\n"
            b"Expect: 100-continue\r\n\r\n"
        )
        reply = await asyncio.wait_for(reader.read(), 30)  # closed after it: no body read
        writer.close()
    assert reply.startswith(b"HTTP/1.1 400 Bad Request\r\n"), reply
    assert b"100 Continue" not in reply and b"Connection: close\r\n" in reply
    assert b"not you" in reply and sql.seen == []
