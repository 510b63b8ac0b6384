"""One tenant-facing certificate authority for every node of a platform, kept in the store, on
both backends: made or brought from the first node's data directory once, taken by every other
node (which says when the certificate its clients trust changes), replaced only by a node no
other node up serves it beside, refused to a node outside its names while others serve it; the
key in the store only; a SQLite store's node as before, with nothing in the store."""

from __future__ import annotations

import asyncio
import datetime
import logging
from pathlib import Path

import pytest
from cryptography import x509

from pgplane.config import Settings
from pgplane.core import clock
from pgplane.core.nodes import ACTIVE, Node
from pgplane.proxy_tls import proxy_certificate
from pgplane.services import nodes
from pgplane.services.proxy_authority import NotCovered
from pgplane.store import Store
from pgplane.tls import ProxyTLS, ensure_certificate, server_context
from pgplane.tls import authority as ca_module
from pgplane.tls.authority import ensure_authority
from tests.unit.test_tls import _handshake

_US = 1_000_000
_STORE = "postgresql://a-store-of-several-nodes"  # which kind of store: only its being set counts


def _settings(data_dir: Path, host: str = "localhost", store: str | None = _STORE) -> Settings:
    return Settings(data_dir=data_dir, proxy_host=host, store=store)


def _cert(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


async def _up(store: Store, name: str) -> None:
    """Node ``name`` registered in the store, its lease running."""
    now = clock.now_us()
    node = Node(
        name=name, instance=f"{name}.i", api_url="", proxy_address="", compute_host="127.0.0.1",
        capacity=1, state=ACTIVE, started_at=now, heartbeat_at=now, expires_at=now + 60 * _US,
    )  # fmt: skip
    async with store.write() as tx:
        await nodes.register(tx, node)


async def _stored(store: Store) -> x509.Certificate | None:
    async with store.read() as tx:
        found = await tx.get_proxy_authority()
    return None if found is None else x509.load_pem_x509_certificate(found[0].encode())


async def _verifies(tls: ProxyTLS, cafile: Path) -> None:
    """A client trusting ``cafile`` takes the proxy's certificate, by the endpoint's name."""
    await _handshake(server_context(tls), "ep-x.localhost", cafile)


async def test_the_first_nodes_own_authority_becomes_the_platforms_and_the_next_switches(
    tmp_path: Path, any_store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    # Node A's data directory from its single-node days: clients trust its ca.crt already.
    a, b = _settings(tmp_path / "a"), _settings(tmp_path / "b")
    ensure_certificate(a.tls_dir, "localhost")
    trusted_a = tmp_path / "trusted-a.crt"
    trusted_a.write_bytes((a.tls_dir / "ca.crt").read_bytes())
    ensure_authority(b.tls_dir, "localhost")  # B had one of its own too
    before_b = _cert(b.tls_dir / "ca.crt")

    tls_a = await proxy_certificate(a, any_store, "node-a")
    assert await _stored(any_store) == _cert(trusted_a)  # A's own, now the platform's
    assert (a.tls_dir / "ca.crt").read_bytes() == trusted_a.read_bytes()
    assert not (a.tls_dir / "ca.key").exists()  # its key is in the store only

    with caplog.at_level(logging.WARNING, logger="pgplane"):
        tls_b = await proxy_certificate(b, any_store, "node-b")
    assert _cert(b.tls_dir / "ca.crt") == _cert(trusted_a) != before_b
    assert not (b.tls_dir / "ca.key").exists()
    switched = [r.getMessage() for r in caplog.records if "of before is replaced" in r.message]
    assert len(switched) == 1 and str(b.tls_dir / "ca.crt") in switched[0], caplog.text

    # A client that trusted node A before verifies both nodes, by a certificate each of its own.
    for tls in (tls_a, tls_b):
        await _verifies(tls, trusted_a)
    assert _cert(tls_a.pair.cert) != _cert(tls_b.pair.cert)

    # A restart changes nothing, and says nothing.
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="pgplane"):
        again = await proxy_certificate(b, any_store, "node-b")
    assert _cert(again.pair.cert) == _cert(tls_b.pair.cert)
    assert caplog.records == []


async def test_nodes_starting_together_agree_on_one(tmp_path: Path, any_store: Store) -> None:
    dirs = [_settings(tmp_path / name) for name in ("a", "b", "c")]
    for settings in dirs[:2]:  # two of them with authorities of their own
        ensure_authority(settings.tls_dir, "localhost")
    made = await asyncio.gather(
        *(proxy_certificate(s, any_store, f"node-{i}") for i, s in enumerate(dirs))
    )
    stored = await _stored(any_store)
    assert stored is not None
    for settings, tls in zip(dirs, made, strict=True):
        assert _cert(settings.tls_dir / "ca.crt") == stored
        await _verifies(tls, dirs[0].tls_dir / "ca.crt")


async def test_an_own_authority_unfit_for_the_proxy_host_is_not_brought(
    tmp_path: Path, any_store: Store
) -> None:
    a = _settings(tmp_path / "a", host="db.example.test")
    old = ensure_authority(a.tls_dir, "localhost")  # not valid for db.example.test
    tls = await proxy_certificate(a, any_store, "node-a")
    stored = await _stored(any_store)
    assert stored is not None and stored != old.cert
    assert _cert(a.tls_dir / "ca.crt") == stored
    await _handshake(server_context(tls), "ep-x.db.example.test", a.tls_dir / "ca.crt")


async def test_a_node_outside_its_names_is_refused_while_another_serves_it(
    tmp_path: Path, any_store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    a = _settings(tmp_path / "a", host="a.example.test")
    b = _settings(tmp_path / "b", host="db.example.test")
    await _up(any_store, "node-a")
    await proxy_certificate(a, any_store, "node-a")
    platforms = await _stored(any_store)
    with pytest.raises(NotCovered) as refused:
        await proxy_certificate(b, any_store, "node-b")
    message = str(refused.value)
    for said in ("db.example.test", "localhost, a.example.test, 127.0.0.0/8", "node-a"):
        assert said in message, message
    assert await _stored(any_store) == platforms  # nothing changed
    assert not b.tls_dir.exists()

    # Alone (node A's lease ended, as at a graceful stop): it replaces it, and says so.
    async with any_store.write() as tx:
        now = clock.now_us()
        await tx.renew_node(name="node-a", instance="node-a.i", now=now, expires_at=now)
    with caplog.at_level(logging.WARNING, logger="pgplane"):
        tls = await proxy_certificate(b, any_store, "node-b")
    stored = await _stored(any_store)
    assert stored is not None and stored != platforms
    assert "is replaced (it is not valid for the proxy host db.example.test)" in caplog.text
    await _handshake(server_context(tls), "api.db.example.test", b.tls_dir / "ca.crt")
    # Node A, back with its old proxy host, while B is up: refused in turn.
    await _up(any_store, "node-b")
    with pytest.raises(NotCovered, match="node-b"):
        await proxy_certificate(a, any_store, "node-a")


async def test_one_near_its_end_is_kept_while_others_serve_it_and_replaced_alone(
    tmp_path: Path, any_store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = _settings(tmp_path / "a"), _settings(tmp_path / "b")
    with monkeypatch.context() as m:
        m.setattr(ca_module, "CA_VALID", datetime.timedelta(days=100))
        await proxy_certificate(a, any_store, "node-a")
    due = await _stored(any_store)
    await _up(any_store, "node-a")
    await proxy_certificate(b, any_store, "node-b")  # still valid: kept, node A serves it
    assert await _stored(any_store) == due == _cert(b.tls_dir / "ca.crt")
    # Node B restarts while A is away: made again, for ten years.
    async with any_store.write() as tx:
        now = clock.now_us()
        await tx.renew_node(name="node-a", instance="node-a.i", now=now, expires_at=now)
    await proxy_certificate(b, any_store, "node-b")
    renewed = await _stored(any_store)
    assert renewed is not None and due is not None and renewed != due
    assert renewed.not_valid_after_utc - due.not_valid_after_utc > datetime.timedelta(days=3000)


async def test_the_store_keeps_one_and_a_put_replaces_it(any_store: Store) -> None:
    async with any_store.write() as tx:
        assert await tx.get_proxy_authority() is None
        await tx.put_proxy_authority(cert="one", key="k1", now=1)
    async with any_store.write() as tx:
        await tx.put_proxy_authority(cert="two", key="k2", now=2)
    async with any_store.read() as tx:
        assert await tx.get_proxy_authority() == ("two", "k2")
        # Apart from the node authority, whose certificates open the node door.
        assert await tx.get_node_authority() is None


async def test_a_sqlite_stores_node_keeps_its_own_as_before(
    tmp_path: Path, any_store: Store
) -> None:
    settings = _settings(tmp_path / "a", store=None)
    own = ensure_authority(settings.tls_dir, "localhost")
    tls = await proxy_certificate(settings, any_store, "node-a")
    assert tls.authority is not None and tls.authority.cert == own.cert
    assert (settings.tls_dir / "ca.key").exists()
    assert await _stored(any_store) is None
