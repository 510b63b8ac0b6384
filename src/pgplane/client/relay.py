"""A relay that speaks TLS for a client that cannot: ``pgplane psql``'s way to the proxy.

The psql that comes with pgplane (the Postgres wheel's) is built without SSL, and the proxy
takes no connection without TLS. The relay listens on a Unix socket in a directory of its
own (0700, so only its user reaches it); each connection made there is taken to the server over
TCP, upgraded to TLS as libpq would (an ``SSLRequest``, then the handshake, the certificate
checked as ``sslmode`` says), and then carried both ways as it is: the client's own startup,
SCRAM exchange and cancel requests pass through, the one change being the server's offer of
channel binding, which libpq refuses to see on a plain socket (:func:`_login`). The password
is never in the relay's hands: SCRAM proves it without sending it.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import ssl
import struct
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from pgplane.proxy.wire import SSL_REQUEST

_CHUNK = 1 << 16
_MAX_LOGIN_MESSAGE = 1 << 16
_AUTH_OK = 0
_AUTH_SASL = 10
_CONNECT_SECONDS = 30.0
# libpq's modes that check nothing of the certificate, and those that check its chain.
_UNCHECKED = frozenset({"allow", "prefer", "require"})
_CHECKED = frozenset({"verify-ca", "verify-full"})
_LIBPQ_ROOT = str(Path.home() / ".postgresql" / "root.crt")


class RelayError(Exception):
    """The connection string asks for what the relay cannot do; the message says what."""


@dataclass(frozen=True, slots=True)
class Upstream:
    """Where the relay takes each connection, and how it checks the server."""

    host: str  # dialled (the hostaddr when given)
    port: int
    server_name: str | None  # SNI and, with verify-full, the name the certificate must hold
    context: ssl.SSLContext | None  # None: sslmode=disable, no TLS


def upstream(params: Mapping[str, str]) -> Upstream:
    """The server a libpq connection string names, and TLS as its ``sslmode`` asks (``require``
    when it says nothing, as the platform's URIs do). RelayError for a Unix socket host (no TLS
    to add there) or a mode libpq does not have."""
    host = params.get("host", "").split(",")[0] or "localhost"
    if host.startswith(("/", "@")):
        raise RelayError(f"host {host} is a Unix socket: connect with psql itself, no TLS there")
    address = params.get("hostaddr", "").split(",")[0] or host
    try:
        port = int(params.get("port", "").split(",")[0] or 5432)
    except ValueError:
        raise RelayError(f"port {params['port']!r} is not a number") from None
    mode = params.get("sslmode") or "require"
    named = None if _is_address(host) else host
    if mode == "disable":
        return Upstream(address, port, named, None)
    if mode not in _UNCHECKED | _CHECKED:
        raise RelayError(f"sslmode {mode!r} is not one of libpq's")
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    if mode in _UNCHECKED:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    else:
        context.check_hostname = mode == "verify-full"
        # As libpq: ~/.postgresql/root.crt unless named; "system", the machine's own store.
        root = params.get("sslrootcert") or _LIBPQ_ROOT
        if root != "system" and (root != _LIBPQ_ROOT or Path(root).is_file()):
            try:
                context.load_verify_locations(cafile=root)
            except (OSError, ssl.SSLError) as exc:
                raise RelayError(f"sslrootcert {root}: {exc}") from None
    return Upstream(address, port, named, context)


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


class Relay:
    """The relay's listener, on its own thread and event loop, until :meth:`close`."""

    def __init__(self, to: Upstream, socket_dir: Path, port: int = 5432) -> None:
        self._to = to
        self.socket_dir = socket_dir
        self.port = port
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stopping: asyncio.Event | None = None
        self._failed: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="pgplane-relay", daemon=True)

    def __enter__(self) -> Relay:
        self._thread.start()
        self._ready.wait()
        if self._failed is not None:
            raise self._failed
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._stopping is not None:
            self._loop.call_soon_threadsafe(self._stopping.set)
        self._thread.join(timeout=5)

    def _run(self) -> None:
        try:
            self._loop.run_until_complete(self._serve())
        finally:
            self._loop.close()

    async def _serve(self) -> None:
        self._stopping = asyncio.Event()
        path = self.socket_dir / f".s.PGSQL.{self.port}"
        try:
            server = await asyncio.start_unix_server(self._relay, path=str(path))
        except OSError as exc:
            self._failed = RelayError(f"cannot listen on {path}: {exc}")
            self._ready.set()
            return
        self._ready.set()
        async with server:
            await self._stopping.wait()
        # Connections still open end with the relay (psql has exited by now).
        current = asyncio.current_task()
        left = [t for t in asyncio.all_tasks() if t is not current]
        if left:  # the proxy's side of a session psql ended is a moment behind
            await asyncio.wait(left, timeout=1)
        for task in left:
            task.cancel()
        await asyncio.gather(*left, return_exceptions=True)

    async def _relay(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        to = self._to
        server_w: asyncio.StreamWriter | None = None
        try:
            async with asyncio.timeout(_CONNECT_SECONDS):
                server_r, server_w = await asyncio.open_connection(to.host, to.port)
                if to.context is not None:
                    await _start_tls(server_r, server_w, to)
        except (OSError, ssl.SSLError, TimeoutError, asyncio.IncompleteReadError) as exc:
            if server_w is not None:
                server_w.close()
            await _refuse(client_r, client_w, f"cannot reach {to.host}:{to.port} over TLS: {exc}")
            return
        try:
            await asyncio.gather(_copy(client_r, server_w), _login(server_r, client_w))
        except asyncio.CancelledError:
            return  # the relay closing: its connections end (asyncio's callback says no more)
        finally:
            for writer in (server_w, client_w):
                writer.close()


async def _start_tls(
    server_r: asyncio.StreamReader, server_w: asyncio.StreamWriter, to: Upstream
) -> None:
    """libpq's way into TLS: an SSLRequest, the server's "S", the handshake."""
    assert to.context is not None  # noqa: S101 - the caller's check
    server_w.write(struct.pack("!II", 8, SSL_REQUEST))
    await server_w.drain()
    if await server_r.readexactly(1) != b"S":
        raise ssl.SSLError(f"{to.host}:{to.port} does not speak TLS")
    await server_w.start_tls(to.context, server_hostname=to.server_name)


async def _login(server: asyncio.StreamReader, client: asyncio.StreamWriter) -> None:
    """The server's side of the login, read message by message until it is over, then copied
    byte for byte. One change: the proxy offers SCRAM-SHA-256-PLUS (channel binding) over its
    TLS, which libpq refuses to see offered on the relay's plain socket; the offer reaches the
    client without it (the binding would bind the relay's TLS, not the client's)."""
    with contextlib.suppress(OSError, ssl.SSLError, asyncio.IncompleteReadError):
        while True:
            header = await server.readexactly(5)
            kind, size = header[:1], struct.unpack("!I", header[1:])[0]
            if size < 4 or size > _MAX_LOGIN_MESSAGE:
                raise OSError(f"a login message of {size} bytes")
            body = await server.readexactly(size - 4)
            code = struct.unpack("!I", body[:4])[0] if kind == b"R" and len(body) >= 4 else None
            if code == _AUTH_SASL:
                offered = [m for m in body[4:].split(b"\0") if m]
                body = body[:4] + b"".join(m + b"\0" for m in offered if not m.endswith(b"-PLUS"))
                body += b"\0"
            client.write(kind + struct.pack("!I", len(body) + 4) + body)
            await client.drain()
            if kind == b"E" or code == _AUTH_OK:
                break
    await _copy(server, client)


async def _copy(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    with contextlib.suppress(OSError, ssl.SSLError):
        while data := await source.read(_CHUNK):
            sink.write(data)
            await sink.drain()
        if sink.can_write_eof():
            sink.write_eof()
        else:  # TLS: no half close; the other way ends with it
            sink.close()


async def _refuse(
    client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter, message: str
) -> None:
    """What the client reads instead of the server: an ErrorResponse, as libpq prints it, once
    its startup is in (written before, libpq may find the socket closed under its write)."""
    with contextlib.suppress(OSError, TimeoutError):
        async with asyncio.timeout(5):
            await client_r.read(_CHUNK)
    fields = b"SFATAL\0VFATAL\0C08001\0M" + message.encode() + b"\0\0"
    client_w.write(b"E" + struct.pack("!I", len(fields) + 4) + fields)
    with contextlib.suppress(OSError):
        await client_w.drain()
    client_w.close()
