"""The platform's certificate authority and the proxy's certificates: what they name, when they
are made again, and that the operator's own pair is left alone. Handshakes are real TLS (Python's
OpenSSL, as libpq's), verified against the authority's certificate alone."""

from __future__ import annotations

import asyncio
import datetime
import ssl
import stat
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from pgplane.config import Settings
from pgplane.proxy_tls import proxy_certificate
from pgplane.store import Store
from pgplane.tls import (
    CertPair,
    ProxyTLS,
    by_name,
    ca_certificate,
    ensure_certificate,
    server_context,
)
from pgplane.tls import authority as ca_module


def _cert(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def _names(cert: x509.Certificate) -> set[str]:
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return {str(n.value) for n in san}


def _self_signed(pair: CertPair) -> None:
    """A certificate as an install from before the authority made it."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name)
        .public_key(key.public_key()).serial_number(1)
        .not_valid_before(now).not_valid_after(now + datetime.timedelta(days=3650))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
        .sign(key, hashes.SHA256())
    )  # fmt: skip
    pair.key.parent.mkdir(mode=0o700)
    pair.key.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def test_the_authority_is_private_and_signs_the_proxy_for_its_names(tmp_path: Path) -> None:
    directory = tmp_path / "tls"
    tls = ensure_certificate(directory, "db.example.test")
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    assert stat.S_IMODE((directory / "ca.key").stat().st_mode) == 0o600
    assert stat.S_IMODE(tls.pair.key.stat().st_mode) == 0o600
    assert ca_certificate(directory) == directory / "ca.crt"

    ca, leaf = _cert(directory / "ca.crt"), _cert(tls.pair.cert)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    leaf.verify_directly_issued_by(ca)
    assert _names(leaf) == {
        "localhost", "*.localhost", "db.example.test", "*.db.example.test",
        "127.0.0.1", "::1",
    }  # fmt: skip
    # The authority signs for the platform's names only.
    permitted = ca.extensions.get_extension_for_class(x509.NameConstraints).value
    assert {str(s.value) for s in permitted.permitted_subtrees or []} == {
        "localhost", "db.example.test", "127.0.0.0/8", "::1/128",
    }  # fmt: skip

    # An address as the proxy host: named as an address.
    other = ensure_certificate(tmp_path / "ip", "192.0.2.7")
    assert _names(_cert(other.pair.cert)) == {
        "localhost", "*.localhost", "192.0.2.7", "127.0.0.1", "::1",
    }  # fmt: skip


def test_the_certificate_is_made_again_only_when_it_must(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = tmp_path / "tls"
    tls = ensure_certificate(directory, "localhost")
    ca_pem, leaf_pem = (directory / "ca.crt").read_bytes(), tls.pair.cert.read_bytes()

    # The same names: nothing changes.
    ensure_certificate(directory, "localhost")
    assert tls.pair.cert.read_bytes() == leaf_pem
    assert (directory / "ca.crt").read_bytes() == ca_pem

    # Another proxy host: a certificate for it. The authority, constrained to its names, is
    # made again too (clients must trust the new one; the log says so).
    ensure_certificate(directory, "db.example.test")
    assert "api.db.example.test" not in _names(_cert(tls.pair.cert))
    assert "*.db.example.test" in _names(_cert(tls.pair.cert))
    assert (directory / "ca.crt").read_bytes() != ca_pem
    ca_pem = (directory / "ca.crt").read_bytes()

    # Near its end: made again, by the same authority.
    monkeypatch.setattr(ca_module, "LEAF_VALID", datetime.timedelta(days=10))
    tls.pair.cert.unlink()
    ensure_certificate(directory, "db.example.test")
    short = _cert(tls.pair.cert)
    monkeypatch.undo()
    ensure_certificate(directory, "db.example.test")
    renewed = _cert(tls.pair.cert)
    assert renewed.serial_number != short.serial_number
    assert renewed.not_valid_after_utc - short.not_valid_after_utc > datetime.timedelta(days=700)
    assert (directory / "ca.crt").read_bytes() == ca_pem

    # A key that does not match its certificate (a crash between the two writes): both anew.
    tls.pair.key.write_bytes(
        ec.generate_private_key(ec.SECP256R1()).private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    ensure_certificate(directory, "db.example.test")
    assert _cert(tls.pair.cert).serial_number != renewed.serial_number


def test_an_older_installs_self_signed_certificate_is_replaced(tmp_path: Path) -> None:
    directory = tmp_path / "tls"
    pair = CertPair(directory / "proxy.crt", directory / "proxy.key")
    _self_signed(pair)
    ensure_certificate(directory, "localhost")
    leaf = _cert(pair.cert)
    leaf.verify_directly_issued_by(_cert(directory / "ca.crt"))
    assert "*.localhost" in _names(leaf)


async def test_the_operators_own_certificate_wins_and_is_left_alone(
    tmp_path: Path, any_store: Store
) -> None:
    own = CertPair(tmp_path / "own" / "proxy.crt", tmp_path / "own" / "proxy.key")
    _self_signed(own)
    before = (own.cert.read_bytes(), own.key.read_bytes())
    for store in (None, "postgresql://a-store-of-several-nodes"):
        settings = Settings(
            data_dir=tmp_path / "data", tls_cert=own.cert, tls_key=own.key, store=store
        )
        tls = await proxy_certificate(settings, any_store, "node-a")
        assert tls == ProxyTLS(own)
        assert (own.cert.read_bytes(), own.key.read_bytes()) == before
        assert not settings.tls_dir.exists()  # no authority made beside it
    async with any_store.read() as tx:
        assert await tx.get_proxy_authority() is None  # nor in the store


async def _handshake(context: ssl.SSLContext, name: str, cafile: Path) -> x509.Certificate:
    """The certificate a client verifying against ``cafile`` is shown for ``name``."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=context)
    port = server.sockets[0].getsockname()[1]
    client = ssl.create_default_context(cafile=str(cafile))
    try:
        _, writer = await asyncio.open_connection(
            "127.0.0.1", port, ssl=client, server_hostname=name
        )
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        writer.close()
        return x509.load_der_x509_certificate(der)
    finally:
        server.close()
        await server.wait_closed()


async def test_names_under_localhost_get_a_certificate_each(tmp_path: Path) -> None:
    """``*.localhost`` is in the certificate, but OpenSSL and node take no wildcard right under
    one label: ``ep-….localhost`` and ``api.localhost`` are verified with one made for them."""
    directory = tmp_path / "tls"
    tls = ensure_certificate(directory, "localhost")
    context = server_context(tls)
    cafile = directory / "ca.crt"
    for name in ("ep-cool-dew-12345678.localhost", "api.localhost", "EP-X-pooler.localhost"):
        cert = await _handshake(context, name, cafile)
        assert _names(cert) == {name.lower()}
    for name in ("localhost", "127.0.0.1"):
        assert await _handshake(context, name, cafile) == _cert(tls.pair.cert)
    # A name deeper down, or under another host, is not made: the proxy's certificate is shown,
    # which does not cover it.
    for name in ("a.b.localhost", "ep-x.example.test"):
        with pytest.raises(ssl.SSLCertVerificationError):
            await _handshake(context, name, cafile)


async def test_names_under_a_longer_host_take_the_wildcard(tmp_path: Path) -> None:
    directory = tmp_path / "tls"
    tls = ensure_certificate(directory, "db.example.test")
    context = server_context(tls)
    for name in ("ep-x.db.example.test", "api.db.example.test", "db.example.test"):
        assert await _handshake(context, name, directory / "ca.crt") == _cert(tls.pair.cert)
    assert _names(await _handshake(context, "ep-x.localhost", directory / "ca.crt")) == {
        "ep-x.localhost"
    }


async def test_the_names_made_are_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(by_name, "CACHED", 3)
    tls = ensure_certificate(tmp_path / "tls", "localhost")
    assert tls.authority is not None
    made = by_name.ByName(tls.authority, tls.pair.key, "localhost", tmp_path / "tls")
    template = server_context(tls)
    for i in range(10):
        made.get(f"ep-{i}.localhost", template)
    assert len(made._made) == 3
    assert not list((tmp_path / "tls").glob(".sni-*"))  # nothing left behind
