"""Tenant walls at the node door, the way between nodes, tried as a stranger, a tenant and a
node would try them, on two real nodes sharing one PostgreSQL store.

The door takes only a certificate of the platform's node authority: a connection in the clear,
one with no client certificate, one with a certificate of the tenant-facing authority (the one
clients trust, which a client can hold a certificate of) or of another platform's node authority
is cut in the handshake, before a byte of its request is read; nothing wakes. Nor does the
authority's signature suffice: the authority's key is in the store, so a certificate opens the
door only if a node that is up registered it there, and a node down or removed loses its door
at once. A node of the
platform is trusted with no more than "this login was authenticated": the door routes from its
own reads of the store (the allow-list against the client's address, the role's secret, the
platform's own roles refused) and relays to nothing but its own computes. And the proxy is no
relay to an address a client names: it routes by endpoint, through the store, only.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from websockets.sync.client import connect as ws_connect

from pgplane.nodelink import messages
from pgplane.nodelink.authority import NodeAuthority, NodeTls
from pgplane.proxy import wire
from pgplane.tls.authority import Authority
from tests import pgclient
from tests.nodes import cli, home, running_nodes
from tests.support import Api, Server


@pytest.fixture(scope="module")
def servers() -> Iterator[tuple[Server, Server]]:
    with running_nodes(2) as (a, b):
        yield a, b


@pytest.fixture(scope="module")
def api(servers: tuple[Server, Server]) -> Iterator[Api]:
    _, key = servers[0].create_key("node-door@example.com")
    with Api(servers[0], key) as client:
        yield client


def _on(servers: tuple[Server, Server], api: Api, node: Server, name: str) -> dict[str, Any]:
    """A project placed on ``node`` (the other cordoned meanwhile), its compute suspended."""
    other = servers[1] if node is servers[0] else servers[0]
    other_name = "node-b" if other is servers[1] else "node-a"
    cli(node, "nodes", "cordon", other_name)
    try:
        project = api.create_ready_project(name=name)
    finally:
        cli(node, "nodes", "uncordon", other_name)
    assert home(servers, project["project"]["id"]) is node
    api.suspend(project["project"]["id"], project["endpoints"][0]["id"])
    return project


def _store(server: Server) -> psycopg.Connection[Any]:
    return psycopg.connect(server.env["PGPLANE_STORE"], autocommit=True)


def _door_port(server: Server, node: str) -> int:
    with _store(server) as conn:
        row = conn.execute("SELECT node_address FROM nodes WHERE name = %s", (node,)).fetchone()
    assert row is not None and row[0], row
    return int(row[0].rpartition(":")[2])


def _platform_node(server: Server, name: str) -> NodeTls:
    """A node certificate of this platform's authority, as whoever reads the store could mint
    one (the test reads the authority's key from the store)."""
    with _store(server) as conn:
        row = conn.execute("SELECT cert, key FROM node_authority").fetchone()
    assert row is not None
    return NodeTls(NodeAuthority.from_pem(row[0], row[1]), name)


@contextlib.contextmanager
def _registered(server: Server, name: str = "node-x") -> Iterator[NodeTls]:
    """A node of the platform: ``name`` registered in the store, up, with the certificate it
    shows (as a node does at start; cordoned, so no project is placed on it), gone after."""
    tls = _platform_node(server, name)
    now = int(time.time() * 1e6)
    with _store(server) as conn:
        conn.execute(
            "INSERT INTO nodes (name, instance, api_url, proxy_address, compute_host, capacity,"
            " state, started_at, heartbeat_at, expires_at, door_certs)"
            " VALUES (%s, 'x', '', '', '127.0.0.1', 1, 'cordoned', %s, %s, %s, %s)",
            (name, now, now, now + 3600 * 10**6, tls.certificate.fingerprint),
        )
    try:
        yield tls
    finally:
        with _store(server) as conn:
            conn.execute("DELETE FROM nodes WHERE name = %s", (name,))


def _starts(api: Api, pid: str) -> int:
    return sum(o["action"] == "start_compute" for o in api.operations(pid))


def _connect(project: dict[str, Any], user: str = "neondb_owner", **kw: str) -> messages.Connect:
    return messages.Connect(
        endpoint_id=project["endpoints"][0]["id"],
        version=wire.PROTOCOL_3,
        params={"user": user, "database": "neondb"},
        client=kw.get("client", "127.0.0.1"),
    )


def _ask(port: int, context: ssl.SSLContext | None, request: messages.Request) -> bytes:
    """Send ``request`` to the door at ``port`` (over TLS with ``context``, else in the clear);
    what the door sent back before it closed (b"": nothing)."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as raw:
        if context is None:
            return _exchange(raw, request)
        with context.wrap_socket(raw) as sock:
            return _exchange(sock, request)


def _exchange(sock: socket.socket, request: messages.Request) -> bytes:
    """The door's first answer frame, or what it sent before it closed."""
    sock.sendall(messages.frame(request))
    got = b""
    while chunk := sock.recv(65536):
        got += chunk
        if len(got) >= messages.HEADER:
            size = messages.length(got[: messages.HEADER], limit=messages.MAX_ANSWER << 1)
            if len(got) >= messages.HEADER + size:
                break  # a session's bytes may follow: not waited for
    return got


def _refused(port: int, context: ssl.SSLContext | None, request: messages.Request) -> bool:
    """Whether the door cut the connection without a byte of answer: in the handshake (TLS
    1.3 tells a client its certificate was refused after its Finished, as it reads), or by
    closing it."""
    try:
        return _ask(port, context, request) == b""
    except (ssl.SSLError, ConnectionError):
        return True


def _answer(port: int, tls: NodeTls, request: messages.Request) -> messages.Answer:
    got = _ask(port, tls.client, request)
    size = messages.length(got[: messages.HEADER], limit=messages.MAX_ANSWER)
    return messages.answer(got[messages.HEADER : messages.HEADER + size])


def _client_context(cert_and_key: Path | None) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # the attacker does not care who answers
    if cert_and_key is not None:
        context.load_cert_chain(cert_and_key)
    return context


def _tenant_side_certificate(server: Server, tmp: Path) -> Path:
    """A client certificate signed by the platform's tenant-facing authority, the one every
    node's proxy certificates are signed by (the test reads it from the store, as only the
    platform may)."""
    with _store(server) as conn:
        row = conn.execute("SELECT cert, key FROM proxy_authority").fetchone()
    assert row is not None
    authority = Authority.from_pem(row[0], row[1], tmp / "ca.crt")
    assert authority.cert == x509.load_pem_x509_certificate(
        (server.data_dir / "tls" / "ca.crt").read_bytes()
    )  # the one the node's clients trust
    key = ec.generate_private_key(ec.SECP256R1())
    cert = authority.issue([x509.DNSName("node-a")], key)
    path = tmp / "tenant-side.pem"
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        + cert.public_bytes(serialization.Encoding.PEM)
    )
    return path


def _other_platform_certificate(tmp: Path) -> Path:
    """A node certificate named like a node of this platform, of another platform's authority."""
    issued = NodeAuthority.create().issue("node-a")
    path = tmp / "other-platform.pem"
    path.write_bytes(issued.key_pem + issued.cert_pem)
    return path


def test_only_a_node_certificate_of_the_platform_opens_the_door(
    servers: tuple[Server, Server], api: Api, tmp_path: Path
) -> None:
    a, b = servers
    project = _on(servers, api, b, "door-strangers")
    pid, eid = project["project"]["id"], project["endpoints"][0]["id"]
    port = _door_port(a, "node-b")
    starts = _starts(api, pid)
    request = _connect(project)

    # In the clear (not a TLS handshake); over TLS with no certificate, with the tenant-facing
    # authority's, with another platform's node authority's: each cut, nothing answered.
    assert _refused(port, None, request)
    for certificate in (
        None,
        _tenant_side_certificate(b, tmp_path),
        _other_platform_certificate(tmp_path),
    ):
        assert _refused(port, _client_context(certificate), request), certificate
    assert _starts(api, pid) == starts
    assert api.endpoint(pid, eid)["current_state"] == "idle"

    # A certificate of the platform's own authority, naming a node that is up, minted with
    # the key the store keeps: not one its node registered, so cut likewise.
    for name in ("node-a", "node-x"):
        assert _refused(port, _platform_node(a, name).client, request), name
    assert _starts(api, pid) == starts

    # A node of the platform, asking the same: served, the compute woken by its own node.
    with _registered(a, "node-x") as node:
        answer = _answer(port, node, request)
        assert isinstance(answer, messages.Connected), answer
        assert _starts(api, pid) == starts + 1
        # Its lease lapsed (the node is down): no door for it, at once.
        with _store(a) as conn:
            conn.execute("UPDATE nodes SET expires_at = 0 WHERE name = 'node-x'")
        assert _refused(port, node.client, request)
    # Removed from the store: likewise.
    assert _refused(port, node.client, request)
    assert _starts(api, pid) == starts + 1


@pytest.fixture
def node_x(servers: tuple[Server, Server]) -> Iterator[NodeTls]:
    with _registered(servers[0]) as tls:
        yield tls


def test_a_node_is_trusted_with_a_login_and_no_more(
    servers: tuple[Server, Server], api: Api, node_x: NodeTls
) -> None:
    a, b = servers
    on_b = _on(servers, api, b, "door-trust")
    on_a = _on(servers, api, a, "door-elsewhere")
    pid = on_b["project"]["id"]
    r = api.http.patch(
        f"/projects/{pid}",
        json={"project": {"settings": {"allowed_ips": {"ips": ["127.0.0.1"]}}}},
    )
    assert r.status_code == 200, r.text
    port = _door_port(a, "node-b")
    node = node_x
    starts, starts_a = _starts(api, pid), _starts(api, on_a["project"]["id"])

    # The platform's own roles log in only over the compute's socket, forwarded or not.
    for reserved in ("cloud_admin", "pgplane_monitor"):
        answer = _answer(port, node, _connect(on_b, reserved))
        assert isinstance(answer, messages.Refused), answer
        assert answer.code == wire.INVALID_PASSWORD
    # The allow-list is the owning node's to check, against the client's address it is told.
    answer = _answer(port, node, _connect(on_b, client="127.0.0.2"))
    assert isinstance(answer, messages.Refused), answer
    assert answer.message.startswith("This IP address 127.0.0.2 is not allowed")
    # An endpoint that is not there, or not this node's: refused, never relayed on.
    missing = messages.Connect("ep-nobody-123456", wire.PROTOCOL_3, {"user": "x"}, "127.0.0.1")
    answer = _answer(port, node, missing)
    assert isinstance(answer, messages.Refused) and answer.code == wire.CONNECTION_REJECTED
    answer = _answer(port, node, _connect(on_a))
    assert isinstance(answer, messages.NotHere), answer
    assert _starts(api, pid) == starts
    assert _starts(api, on_a["project"]["id"]) == starts_a
    # Reads of another node's project are not answered here either.
    ask = messages.SchemaAsk(on_a["project"]["id"], on_a["branch"]["id"], 17, "neondb", 1 << 20)
    assert isinstance(_answer(port, node, ask), messages.NotHere)
    # A request that is none of the protocol's: closed, nothing answered.
    got = _ask(port, node.client, messages.Schema("not a request"))  # type: ignore[arg-type]
    assert got == b""


def test_the_proxy_relays_to_no_address_a_client_names(
    servers: tuple[Server, Server], api: Api
) -> None:
    a, b = servers
    project = _on(servers, api, b, "door-relay")
    uri = project["connection_uris"][0]["connection_uri"]
    password = project["connection_uris"][0]["connection_parameters"]["password"]
    # An address a client would like the proxy to dial; listening, so a dial would be seen.
    with socket.create_server(("127.0.0.1", 0)) as bait:
        bait.setblocking(False)
        target = f"127.0.0.1:{bait.getsockname()[1]}"
        # The Postgres door: the endpoint is a name looked up in the store, an address in its
        # place is no endpoint (refused as a wrong password is, after the same exchange).
        for named in (target, f"ep-x.{target}"):
            login = pgclient.login(
                a.proxy_port, endpoint=named, user="neondb_owner", password=password
            )
            with login.sock:
                assert login.code == wire.INVALID_PASSWORD, (named, login.error)
        # SQL over HTTP: the connection string's host names an endpoint or nothing; with the
        # URI's options the endpoint is the project's own, answered by its own compute.
        aimed = uri.replace(f"localhost:{a.proxy_port}", target)
        r = httpx.post(
            f"http://127.0.0.1:{a.proxy_port}/sql",
            headers={"Neon-Connection-String": aimed.split("?")[0]},
            json={"query": "SELECT 1", "params": []},
            timeout=30,
        )
        assert r.status_code == 400 and "endpoint not specified" in r.json()["message"], r.text
        r = httpx.post(
            f"http://127.0.0.1:{a.proxy_port}/sql",
            headers={"Neon-Connection-String": aimed},
            json={"query": "SELECT current_database() AS db", "params": []},
            timeout=60,
        )
        assert r.status_code == 200, r.text
        assert r.json()["rows"] == [{"db": "neondb"}]
        # A WebSocket's address= names an endpoint by its host, or nothing.
        with ws_connect(
            f"ws://127.0.0.1:{a.proxy_port}/v2?address={target}", compression=None
        ) as ws:
            ws.send(wire.Startup(wire.PROTOCOL_3, {"user": "neondb_owner"}).encode())
            refusal = ws.recv(timeout=30)
        assert isinstance(refusal, bytes) and refusal[:1] == b"E"
        assert "endpoint not specified" in wire.error_fields(refusal[5:]).get("M", "")
        with pytest.raises(BlockingIOError):
            bait.accept()  # nothing of the proxy's came: every answer above came first
