"""``pgplane psql``'s relay: what it reads of a connection string, and the one change it makes
to what the server says (the channel-binding offer libpq refuses on a plain socket)."""

from __future__ import annotations

import asyncio
import ssl
import struct
from pathlib import Path

import pytest

from pgplane.client import relay


def test_the_server_and_tls_are_read_as_libpq_reads_them(tmp_path: Path) -> None:
    given = relay.upstream({"host": "db.example.com", "hostaddr": "127.0.0.5", "port": "6543"})
    assert (given.host, given.port, given.server_name) == ("127.0.0.5", 6543, "db.example.com")
    assert given.context is not None and given.context.verify_mode == ssl.CERT_NONE  # require
    assert relay.upstream({"host": "127.0.0.1", "sslmode": "disable"}).context is None
    assert relay.upstream({"host": "127.0.0.1"}).server_name is None  # no SNI for an address
    full = relay.upstream({"host": "localhost", "sslmode": "verify-full", "sslrootcert": "system"})
    assert full.context is not None and full.context.check_hostname
    with pytest.raises(relay.RelayError, match="Unix socket"):
        relay.upstream({"host": "/var/run/postgresql"})
    with pytest.raises(relay.RelayError, match="not one of libpq's"):
        relay.upstream({"host": "localhost", "sslmode": "sometimes"})
    with pytest.raises(relay.RelayError, match="sslrootcert"):
        relay.upstream(
            {"host": "localhost", "sslmode": "verify-ca", "sslrootcert": str(tmp_path / "no")}
        )


def _message(kind: bytes, body: bytes) -> bytes:
    return kind + struct.pack("!I", len(body) + 4) + body


class _Sink:
    def __init__(self) -> None:
        self.data = b""

    def write(self, data: bytes) -> None:
        self.data += data

    async def drain(self) -> None:
        pass

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        pass


async def test_the_offer_reaches_the_client_without_channel_binding() -> None:
    offer = _message(b"R", struct.pack("!I", 10) + b"SCRAM-SHA-256-PLUS\0SCRAM-SHA-256\0\0")
    ok = _message(b"R", struct.pack("!I", 0))
    after = _message(b"Z", b"I") + b"E\0\0\0\x04 anything after the login, untouched"
    server = asyncio.StreamReader()
    server.feed_data(offer + ok + after)
    server.feed_eof()
    client = _Sink()
    await relay._login(server, client)  # type: ignore[arg-type]
    expected = _message(b"R", struct.pack("!I", 10) + b"SCRAM-SHA-256\0\0")
    assert client.data == expected + ok + after
