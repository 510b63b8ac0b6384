"""The node channel's parts (src/pgplane/nodelink/): the node authority made once in the store on
both backends, certificates that name their node, TLS that takes only the platform's node
certificates (over real sockets), and the messages' frames."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from pgplane.config import Settings
from pgplane.node_channel import open_channel, renew
from pgplane.nodelink import authority as node_authority
from pgplane.nodelink import messages
from pgplane.nodelink.authority import NodeAuthority, NodeTls, peer_of
from pgplane.nodelink.client import Door, NodeLink, Unreachable
from pgplane.services import nodes
from pgplane.store import Store
from pgplane.tls.authority import ensure_authority
from tests.stores import new_location, open_at


async def test_the_authority_is_made_once_and_read_back_whole(any_store: Store) -> None:
    async with any_store.write() as tx:
        made = await nodes.authority(tx)
    async with any_store.write() as tx:
        again = await nodes.authority(tx)
    assert again.cert == made.cert
    assert again.key.private_numbers() == made.key.private_numbers()
    async with any_store.read() as tx:
        cert, _key = await tx.get_node_authority() or ("", "")
    assert cert == made.cert_pem()


async def test_a_second_authority_cannot_be_recorded(any_store: Store) -> None:
    async with any_store.write() as tx:
        await nodes.authority(tx)
    other = NodeAuthority.create()
    with pytest.raises(Exception, match=r"(?i)unique|constraint|duplicate"):
        async with any_store.write() as tx:
            await tx.put_node_authority(cert=other.cert_pem(), key=other.key_pem(), now=1)


def test_a_stored_key_that_is_not_the_certificates_is_refused() -> None:
    one, two = NodeAuthority.create(), NodeAuthority.create()
    with pytest.raises(ValueError, match="not its certificate's"):
        NodeAuthority.from_pem(one.cert_pem(), two.key_pem())


def test_two_authorities_are_told_apart_by_name() -> None:
    assert NodeAuthority.create().cert.subject != NodeAuthority.create().cert.subject


class _Echo(asyncio.Protocol):
    """The far end of a test connection: answers each request frame with a Verifier."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.transport.write(messages.frame(messages.Verifier(answered=True, verifier="v")))  # type: ignore[attr-defined]


@dataclasses.dataclass
class _Door:
    """A TLS server with node-b's certificate of an authority, recording who connected."""

    authority: NodeAuthority
    port: int
    peers: list[str]
    cert: str  # the fingerprint node-b registered

    def at(self, node: str = "node-b") -> Door:
        return Door(node, f"127.0.0.1:{self.port}", (self.cert,))


@pytest.fixture
async def door() -> AsyncIterator[_Door]:
    authority = NodeAuthority.create()
    tls = NodeTls(authority, "node-b")
    peers: list[str] = []

    class Recording(_Echo):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            super().connection_made(transport)
            found = peer_of(transport.get_extra_info("ssl_object"))
            peers.append("" if found is None else found.node)

    server = await asyncio.get_running_loop().create_server(
        Recording, "127.0.0.1", 0, ssl=tls.server
    )
    port = server.sockets[0].getsockname()[1]
    try:
        yield _Door(authority, port, peers, tls.certificate.fingerprint)
    finally:
        server.close()


async def test_a_node_of_the_authority_is_answered_and_knows_who_asked(door: _Door) -> None:
    link = NodeLink(NodeTls(door.authority, "node-a"))
    answer = await link.call(door.at(), messages.RoleVerifier("ep-x", "r"), seconds=10)
    assert answer == messages.Verifier(answered=True, verifier="v")
    assert door.peers == ["node-a"]


async def test_a_node_that_is_not_the_one_named_is_not_asked(door: _Door) -> None:
    link = NodeLink(NodeTls(door.authority, "node-a"))
    with pytest.raises(Unreachable, match="is node-b's, not node-c's"):
        await link.call(door.at("node-c"), messages.RoleVerifier("e", "r"))


async def test_a_door_showing_a_certificate_its_node_did_not_register_is_not_asked(
    door: _Door,
) -> None:
    """A door signed by the authority and named right, but not with the certificate node-b
    registered: one minted with the authority's key by whoever read the store."""
    link = NodeLink(NodeTls(door.authority, "node-a"))
    minted = door.authority.issue("node-b").fingerprint
    with pytest.raises(Unreachable, match="did not register"):
        await link.call(
            dataclasses.replace(door.at(), certs=(minted,)), messages.RoleVerifier("e", "r")
        )
    with pytest.raises(Unreachable, match="did not register"):
        await link.call(dataclasses.replace(door.at(), certs=()), messages.RoleVerifier("e", "r"))


async def test_another_platforms_node_and_a_tenant_certificate_fail_the_handshake(
    door: _Door, tmp_path: Path
) -> None:
    port, peers = door.port, door.peers
    # A node of another platform's authority, whatever its name.
    stranger = NodeLink(NodeTls(NodeAuthority.create(), "node-a"))
    with pytest.raises(Unreachable):
        await stranger.call(door.at(), messages.RoleVerifier("e", "r"))
    # The tenant-facing authority's certificate (the one clients trust), as a client's.
    tenant_ca = ensure_authority(tmp_path, "localhost")
    key = ec.generate_private_key(ec.SECP256R1())
    cert = tenant_ca.issue([x509.DNSName("localhost")], key)
    pair = tmp_path / "tenant.pem"
    pair.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        + cert.public_bytes(serialization.Encoding.PEM)
    )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.load_cert_chain(pair)
    for ctx in (context, _no_certificate()):
        with pytest.raises((ssl.SSLError, ConnectionError, asyncio.IncompleteReadError)):
            await _ask_with(ctx, port)
    assert peers == []


async def _ask_with(context: ssl.SSLContext, port: int) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context)
    try:
        writer.write(messages.frame(messages.RoleVerifier("e", "r")))
        return await reader.readexactly(1)  # TLS 1.3: a refused certificate is told here
    finally:
        writer.close()


def _no_certificate() -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


class _Lease:
    """What renewal asks of the node's lease: the certificates registered, in order."""

    def __init__(self, certs: tuple[str, ...]) -> None:
        self.door_certs = certs
        self.registered: list[list[str]] = []
        self.shown_when_registered: list[str] = []
        self.tls: NodeTls | None = None

    async def register_certs(self, certs: list[str]) -> None:
        assert self.tls is not None
        self.registered.append(certs)
        self.shown_when_registered.append(self.tls.certificate.fingerprint)
        self.door_certs = tuple(certs)


async def test_a_certificate_lasts_a_day_and_its_successor_is_registered_before_it_is_shown() -> (
    None
):
    tls = NodeTls(NodeAuthority.create(), "node-a")
    first = tls.certificate
    assert first.not_after - datetime.datetime.now(datetime.UTC) <= datetime.timedelta(days=1)
    lease = _Lease((first.fingerprint,))
    lease.tls = tls
    await renew(tls, lease)  # type: ignore[arg-type]
    assert tls.certificate is first and lease.registered == []  # not near its end
    tls.certificate = dataclasses.replace(
        first, not_after=datetime.datetime.now(datetime.UTC) + node_authority.RENEW_BEFORE / 2
    )
    await renew(tls, lease)  # type: ignore[arg-type]
    fresh = tls.certificate.fingerprint
    assert fresh != first.fingerprint
    # The new one registered while the old one was still shown, the old one kept beside it.
    assert lease.registered == [[fresh, first.fingerprint]]
    assert lease.shown_when_registered == [first.fingerprint]
    await renew(tls, lease)  # type: ignore[arg-type]
    assert lease.registered[-1] == [fresh]  # at the next look, only the one shown


def test_frames_round_trip_and_are_bounded() -> None:
    ask = messages.SchemaAsk("p", "b", 17, "neondb", 1 << 20, lsn=5)
    framed = messages.frame(ask)
    size = messages.length(framed[: messages.HEADER], limit=messages.MAX_REQUEST)
    assert messages.request(framed[messages.HEADER :]) == ask
    assert size == len(framed) - messages.HEADER
    with pytest.raises(messages.MessageError, match="past its bound"):
        messages.length((1 << 20).to_bytes(4, "big"), limit=messages.MAX_REQUEST)
    with pytest.raises(messages.MessageError):
        messages.request(b"\x81\xa4kind\xa4nope")
    with pytest.raises(messages.MessageError):
        # An answer is not a request.
        messages.request(messages.frame(messages.Schema("x"))[messages.HEADER :])


async def test_the_door_flags_are_refused_on_a_store_of_one_node(tmp_path: Path) -> None:
    """A SQLite store is one node's: there is no door to place, so no flag says where."""
    for flag in ({"node_port": 7000}, {"node_listen": "10.0.0.1"}, {"node_advertise": "n1"}):
        store = await open_at(new_location("sqlite", tmp_path))
        with pytest.raises(SystemExit, match="PostgreSQL --store"):
            await open_channel(store, Settings(data_dir=tmp_path, **flag), "node-a")  # type: ignore[arg-type]
    store = await open_at(new_location("sqlite", tmp_path))
    channel = await open_channel(store, Settings(data_dir=tmp_path), "node-a")
    assert channel.link is None and channel.forwarder() is None
    await store.close()
