"""A Postgres client at the byte level, for tests that must do what libpq will not: bind a
source address, stop half-way through a login, or pour bytes where a client should wait."""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass

from pgplane.proxy import scram, wire


@dataclass
class Login:
    """The outcome of a login: ``error`` is the server's message when it refused, ``code`` its
    SQLSTATE (which libpq does not hand on for a refused connection)."""

    sock: socket.socket
    error: str | None
    code: str | None = None


def _read_message(sock: socket.socket) -> tuple[bytes, bytes]:
    header = _read_exactly(sock, 5)
    (length,) = struct.unpack("!I", header[1:])
    return header[:1], _read_exactly(sock, length - 4)


def _read_exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("closed by the server")
        data += chunk
    return data


def connect(port: int, *, source: str = "127.0.0.1", timeout: float = 30) -> socket.socket:
    sock = socket.socket()
    sock.settimeout(timeout)
    sock.bind((source, 0))
    sock.connect(("127.0.0.1", port))
    return sock


def authenticate(
    sock: socket.socket, *, endpoint: str, user: str, password: str, database: str = "neondb"
) -> Login:
    """Send a plaintext startup and do SCRAM-SHA-256 up to the proxy's SASLFinal (or error).

    Stops there: what the server sends after (AuthenticationOk, once its compute is up) is left
    unread, so a test can act while the proxy wakes the compute.
    """
    startup = wire.Startup(
        wire.PROTOCOL_3, {"user": user, "database": database, "options": f"endpoint={endpoint}"}
    )
    sock.sendall(startup.encode())
    client = scram.ClientExchange(password)
    while True:
        kind, payload = _read_message(sock)
        if kind == b"E":
            fields = wire.error_fields(payload)
            return Login(sock, fields.get("M", "error"), fields.get("C"))
        if kind != b"R":
            raise AssertionError(f"unexpected message {kind!r} during login")
        (code,) = struct.unpack("!I", payload[:4])
        if code == wire.AUTH_SASL:
            sock.sendall(wire.sasl_initial(scram.MECHANISM, client.first().encode()))
        elif code == wire.AUTH_SASL_CONTINUE:
            sock.sendall(wire.password_message(client.final(payload[4:].decode()).encode()))
        elif code == wire.AUTH_SASL_FINAL:
            client.check(payload[4:].decode())
            return Login(sock, None)
        else:
            raise AssertionError(f"unexpected authentication request {code}")


def login(port: int, *, source: str = "127.0.0.1", **credentials: str) -> Login:
    """A login left open (the caller closes ``sock``)."""
    return authenticate(connect(port, source=source), **credentials)


def refusal(port: int, *, source: str = "127.0.0.1", **credentials: str) -> str | None:
    """The server's refusal of a login, or None when the password was taken; closes after."""
    with connect(port, source=source) as sock:
        return authenticate(sock, **credentials).error


def after_login(port: int, **credentials: str) -> Login:
    """A login, and when its password is taken what the server says next: a refusal (the
    compute cannot be had: ``error`` and ``code``) or, ``error`` None, the compute letting it in.
    Closes after."""
    with connect(port) as sock:
        login = authenticate(sock, **credentials)
        if login.error is not None:
            return login
        kind, payload = _read_message(sock)
        if kind == b"E":
            fields = wire.error_fields(payload)
            return Login(sock, fields.get("M", "error"), fields.get("C"))
        return Login(sock, None)
