"""Shared storage on a real S3 server (SeaweedFS, one per module): objects whole or absent, every
read bounded, the store's own errors named, conditional puts, and sealed objects that the bucket
only ever sees as ciphertext."""

from __future__ import annotations

import concurrent.futures
import hashlib
import io
import os
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.objectstore import SeaweedFS

from pgplane.compute.driver import ComputeError
from pgplane.compute.local.shared.s3 import S3Store, parse_url
from pgplane.compute.local.shared.sealed import FRAME, SealedStore

MiB = 1 << 20
ARCHIVE_KEY = os.urandom(32)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedFS]:
    with SeaweedFS(tmp_path_factory.mktemp("seaweedfs")) as running:
        yield running


@pytest.fixture
def aws_env(server: SeaweedFS, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The server's settings and nothing of the machine's (no profile, no ~/.aws)."""
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    for name, value in server.env().items():
        monkeypatch.setenv(name, value)


@pytest.fixture
def prefix() -> str:
    return f"t-{uuid.uuid4().hex[:12]}/pg"


@pytest.fixture
def store(server: SeaweedFS, aws_env: None, prefix: str) -> S3Store:
    return S3Store.from_url(server.url(prefix))


def _raw(server: SeaweedFS, prefix: str, key: str) -> bytes:
    """An object's bytes as the bucket holds them, read past every store."""
    got = server.client().get_object(Bucket=server.bucket, Key=f"{prefix}/{key}")
    data: bytes = got["Body"].read()
    return data


def _put_raw(server: SeaweedFS, prefix: str, key: str, data: bytes) -> None:
    server.client().put_object(Bucket=server.bucket, Key=f"{prefix}/{key}", Body=data)


class _Stream:
    """A source that cannot seek and is never whole in memory: ``size`` bytes made as read, in
    short reads (at most a block each), as a pipe gives them."""

    def __init__(self, size: int) -> None:
        self.left = size
        self.block = os.urandom(MiB + 7)  # not a multiple of any part size
        self.digest = hashlib.sha256()

    def read(self, n: int = -1) -> bytes:
        n = self.left if n < 0 else min(n, self.left, len(self.block))
        chunk = self.block[:n]
        self.left -= n
        self.digest.update(chunk)
        return chunk


class _HashSink:
    def __init__(self) -> None:
        self.digest, self.size = hashlib.sha256(), 0

    def write(self, data: bytes) -> int:
        self.digest.update(data)
        self.size += len(data)
        return len(data)


# -- the URL ----------------------------------------------------------------------------------


def test_urls_name_a_bucket_and_a_prefix() -> None:
    assert parse_url("s3://pgplane") == ("pgplane", "")
    assert parse_url("s3://pgplane/") == ("pgplane", "")
    assert parse_url("s3://pg-plane.data/a/b_c/d-1/") == ("pg-plane.data", "a/b_c/d-1/")
    for bad, why in [
        ("https://pgplane/x", "expected s3://BUCKET/PREFIX"),
        ("s3://", "is not a bucket name"),
        ("s3://ab/x", "is not a bucket name"),
        ("s3://Upper/x", "is not a bucket name"),
        ("s3://key:secret@pgplane/x", "no credentials, port"),
        ("s3://pgplane:9000/x", "no credentials, port"),
        ("s3://pgplane/x?versionId=1", "no credentials, port"),
        ("s3://pgplane/a//b", "the prefix"),
        ("s3://pgplane/a/../b", "the prefix"),
        ("s3://pgplane/.hidden", "the prefix"),
    ]:
        with pytest.raises(ValueError, match=why):
            parse_url(bad)


# -- objects ----------------------------------------------------------------------------------


def test_objects_round_trip_with_their_checksums(
    store: S3Store, server: SeaweedFS, prefix: str
) -> None:
    body = os.urandom(5000)
    sent = store.write("history/p-1/b-1/wal/seg", io.BytesIO(body), max_bytes=5000)
    assert (sent.size, sent.sha256) == (5000, hashlib.sha256(body).hexdigest())
    sink = io.BytesIO()
    got = store.read("history/p-1/b-1/wal/seg", sink, max_bytes=5000)
    assert (got.size, got.sha256) == (sent.size, sent.sha256)
    assert sink.getvalue() == body
    assert _raw(server, prefix, "history/p-1/b-1/wal/seg") == body  # under the URL's prefix
    store.write_bytes("history/p-1/head", b"{}")
    assert store.read_bytes("history/p-1/head", max_bytes=2) == b"{}"
    assert store.exists("history/p-1/head")
    assert store.sizes("history/p-1") == {"history/p-1/b-1/wal/seg": 5000, "history/p-1/head": 2}
    store.write_bytes("history/p-1/head", b"[]", replace=False)  # the first one stays
    assert store.read_bytes("history/p-1/head", max_bytes=2) == b"{}"
    with pytest.raises(ComputeError, match="invalid shared storage key"):
        store.write_bytes("../escape", b"x")


def test_identity_is_kept_in_the_bucket(server: SeaweedFS, aws_env: None, prefix: str) -> None:
    first = S3Store.from_url(server.url(prefix)).identity
    assert len(first) == 32
    assert S3Store.from_url(server.url(prefix)).identity == first
    assert _raw(server, prefix, "pgplane-storage.id").decode() == first
    assert S3Store.from_url(server.url(prefix + "/other")).identity != first


def test_a_large_object_is_streamed_in_parts(
    store: S3Store, server: SeaweedFS, prefix: str
) -> None:
    source = _Stream(70 * MiB)
    sent = store.write("big/obj", source, max_bytes=70 * MiB)  # type: ignore[arg-type]
    assert (sent.size, sent.sha256) == (70 * MiB, source.digest.hexdigest())
    etag = server.client().head_object(Bucket=server.bucket, Key=f"{prefix}/big/obj")["ETag"]
    assert "-" in etag  # a multipart upload's ETag: "<md5 of the parts' md5s>-<parts>"
    sink = _HashSink()
    got = store.read("big/obj", sink, max_bytes=70 * MiB)  # type: ignore[arg-type]
    assert (got.size, got.sha256) == (sink.size, sink.digest.hexdigest()) == (70 * MiB, sent.sha256)


def test_a_write_past_its_bound_leaves_nothing(
    store: S3Store, server: SeaweedFS, prefix: str
) -> None:
    with pytest.raises(ComputeError, match="small: more than 10 bytes to store"):
        store.write("small", io.BytesIO(b"z" * 11), max_bytes=10)
    assert not store.exists("small")
    # Past the multipart threshold: parts were sent, and the upload is aborted.
    with pytest.raises(ComputeError, match=f"big: more than {66 * MiB} bytes to store"):
        store.write("big", _Stream(80 * MiB), max_bytes=66 * MiB)  # type: ignore[arg-type]
    assert not store.exists("big")
    uploads = server.client().list_multipart_uploads(Bucket=server.bucket, Prefix=prefix)
    assert uploads.get("Uploads", []) == []


def test_a_read_past_its_bound_is_refused(store: S3Store) -> None:
    store.write_bytes("a/big", b"y" * 100)
    with pytest.raises(ComputeError, match="a/big is larger than 99 bytes"):
        store.read_bytes("a/big", max_bytes=99)
    with pytest.raises(ComputeError, match="a/big is larger than 99 bytes"):
        store.read("a/big", io.BytesIO(), max_bytes=99)
    assert store.read_bytes("a/big", max_bytes=100) == b"y" * 100


def test_a_missing_object_is_file_not_found(store: S3Store) -> None:
    with pytest.raises(FileNotFoundError):
        store.read("none/here", io.BytesIO(), max_bytes=10)
    with pytest.raises(FileNotFoundError):
        store.read_bytes("none/here", max_bytes=10)
    with pytest.raises(FileNotFoundError):
        store.get_with_etag("none/here", max_bytes=10)
    assert not store.exists("none/here")
    assert list(store.sizes("none")) == []
    store.delete("none")  # nothing to delete is no error


def test_listing_pages_through_every_object_under_the_prefix_only(store: S3Store) -> None:
    names = [f"many/{i:05d}" for i in range(1050)]  # more than one page of 1000
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda k: store.write_bytes(k, b"."), names))
    store.write_bytes("many-more/x", b".")  # shares the prefix's letters, not its folder
    store.write_bytes("many", b".")  # the prefix's own name, as an object
    store.write_bytes("many/deeper/down/y", b".")
    assert list(store.sizes("many")) == sorted([*names, "many/deeper/down/y"])
    store.delete("many")
    assert list(store.sizes("many")) == []
    assert not store.exists("many")
    assert list(store.sizes("many-more")) == ["many-more/x"]


def test_delete_takes_one_object_or_a_tree(store: S3Store) -> None:
    for key in ("d/a", "d/b/c", "d/b/d", "e/f"):
        store.write_bytes(key, b".")
    store.delete("d/a")
    assert list(store.sizes("d")) == ["d/b/c", "d/b/d"]
    store.delete("d/b")
    assert list(store.sizes("d")) == []
    assert list(store.sizes("e")) == ["e/f"]


# -- conditional puts -------------------------------------------------------------------------


def test_put_if_absent_lets_one_writer_win(store: S3Store) -> None:
    assert store.put_if_absent("lease", b"node-1")
    assert not store.put_if_absent("lease", b"node-2")
    assert store.read_bytes("lease", max_bytes=10) == b"node-1"


def test_put_if_match_refuses_a_stale_etag(store: S3Store) -> None:
    store.write_bytes("lease", b"v1")
    data, etag = store.get_with_etag("lease", max_bytes=10)
    assert data == b"v1"
    assert store.put_if_match("lease", b"v2", etag)
    assert not store.put_if_match("lease", b"v3", etag)  # SeaweedFS 4.48 enforces If-Match
    data, newer = store.get_with_etag("lease", max_bytes=10)
    assert (data, newer != etag) == (b"v2", True)
    assert not store.put_if_match("gone", b"v1", etag)
    assert not store.exists("gone")


def test_racing_conditional_puts_have_one_winner(store: S3Store) -> None:
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        won = list(pool.map(lambda i: store.put_if_absent("race", str(i).encode()), range(8)))
    assert won.count(True) == 1
    assert store.read_bytes("race", max_bytes=10) == str(won.index(True)).encode()


# -- the store's own errors -------------------------------------------------------------------


def test_a_usable_bucket_passes_the_check(store: S3Store) -> None:
    store.check_writable()
    assert list(store.sizes("t")) == []


def test_wrong_credentials_are_named(
    server: SeaweedFS, aws_env: None, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "not-a-key-of-this-store")
    store = S3Store.from_url(server.url(prefix))
    with pytest.raises(ComputeError, match=r"s3 put history/x: InvalidAccessKeyId: "):
        store.write_bytes("history/x", b".")
    with pytest.raises(ComputeError, match="InvalidAccessKeyId"):
        store.check_writable()
    with pytest.raises(ComputeError, match="InvalidAccessKeyId"):
        list(store.sizes("history"))
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", server.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong" + server.secret_key)
    store = S3Store.from_url(server.url(prefix))
    with pytest.raises(ComputeError, match=r"s3 get history/x: SignatureDoesNotMatch: "):
        store.read_bytes("history/x", max_bytes=10)
    # A HEAD answer has no body, so no code: the status stands for it, never "not found".
    with pytest.raises(ComputeError, match=r"s3 head history/x: 403: "):
        store.exists("history/x")


def test_a_missing_bucket_is_named(server: SeaweedFS, aws_env: None) -> None:
    store = S3Store.from_url("s3://no-such-bucket-here/pg")
    with pytest.raises(ComputeError, match=r"s3 put x/y: NoSuchBucket: .*no-such-bucket-here"):
        store.write_bytes("x/y", b".")
    with pytest.raises(ComputeError, match=r"s3 get x/y: NoSuchBucket"):
        store.read_bytes("x/y", max_bytes=1)
    with pytest.raises(ComputeError, match="NoSuchBucket"):
        store.check_writable()
    with pytest.raises(ComputeError, match="NoSuchBucket"):
        list(store.sizes("x"))


def test_no_credentials_or_no_server_is_named(
    server: SeaweedFS, aws_env: None, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    with pytest.raises(ComputeError, match=r"s3 put x: NoCredentialsError: Unable to locate"):
        S3Store.from_url(server.url(prefix)).write_bytes("x", b".")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", server.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", server.secret_key)
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))  # bound, never listening: the connection is refused
        monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{closed.getsockname()[1]}")
        with pytest.raises(ComputeError, match=r"s3 get x: EndpointConnectionError: Could not"):
            S3Store.from_url(server.url(prefix)).read_bytes("x", max_bytes=1)


# -- sealed objects in the bucket -------------------------------------------------------------


@pytest.fixture
def sealed(store: S3Store) -> SealedStore:
    return SealedStore(store, ARCHIVE_KEY)


PLAIN = b"tenant row: alice@example.com, card 4111-1111-1111-1111\n" * 2000


def test_the_bucket_holds_no_plaintext(sealed: SealedStore, server: SeaweedFS, prefix: str) -> None:
    sent = sealed.write("wal/seg", io.BytesIO(PLAIN), max_bytes=len(PLAIN))
    assert (sent.size, sent.sha256) == (len(PLAIN), hashlib.sha256(PLAIN).hexdigest())
    raw = _raw(server, prefix, "wal/seg")
    assert b"alice@example.com" not in raw
    assert b"4111" not in raw
    assert len(raw) < len(PLAIN) // 10  # compressed before it was sealed
    sink = io.BytesIO()
    got = sealed.read("wal/seg", sink, max_bytes=len(PLAIN))
    assert (sink.getvalue(), got.sha256) == (PLAIN, sent.sha256)
    assert list(sealed.sizes("wal")) == ["wal/seg"]


def test_a_large_sealed_object_streams_both_ways(sealed: SealedStore) -> None:
    source = _Stream(5 * FRAME + 3)
    sent = sealed.write("big", source, max_bytes=6 * FRAME)  # type: ignore[arg-type]
    sink = _HashSink()
    got = sealed.read("big", sink, max_bytes=6 * FRAME)  # type: ignore[arg-type]
    assert (
        (got.size, got.sha256)
        == (sent.size, sent.sha256)
        == (5 * FRAME + 3, source.digest.hexdigest())
    )


def _refused(sealed: SealedStore, key: str) -> Any:
    return pytest.raises(
        ComputeError, match=f"object {key} is damaged or was sealed with another archive key"
    )


def test_a_flipped_byte_in_the_bucket_is_refused(
    sealed: SealedStore, server: SeaweedFS, prefix: str
) -> None:
    sealed.write_bytes("wal/seg", PLAIN)
    raw = bytearray(_raw(server, prefix, "wal/seg"))
    raw[len(raw) // 2] ^= 0x40
    _put_raw(server, prefix, "wal/seg", bytes(raw))
    with _refused(sealed, "wal/seg"):
        sealed.read_bytes("wal/seg", max_bytes=len(PLAIN))


def test_an_object_copied_to_another_key_is_refused(
    sealed: SealedStore, server: SeaweedFS, prefix: str
) -> None:
    sealed.write_bytes("wal/seg-1", PLAIN)
    _put_raw(server, prefix, "wal/seg-2", _raw(server, prefix, "wal/seg-1"))
    with _refused(sealed, "wal/seg-2"):
        sealed.read_bytes("wal/seg-2", max_bytes=len(PLAIN))


def test_a_truncated_object_is_refused(sealed: SealedStore, server: SeaweedFS, prefix: str) -> None:
    sealed.write_bytes("wal/seg", os.urandom(2 * FRAME))
    raw = _raw(server, prefix, "wal/seg")
    _put_raw(server, prefix, "wal/seg", raw[: 40 + FRAME + 16])  # the first frame, whole
    with _refused(sealed, "wal/seg"):
        sealed.read_bytes("wal/seg", max_bytes=2 * FRAME)


def test_another_archive_key_is_refused(store: S3Store, sealed: SealedStore) -> None:
    sealed.write_bytes("wal/seg", PLAIN)
    with _refused(sealed, "wal/seg"):
        SealedStore(store, os.urandom(32)).read_bytes("wal/seg", max_bytes=len(PLAIN))
