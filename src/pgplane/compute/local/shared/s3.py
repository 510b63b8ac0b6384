"""Shared storage in an S3 bucket: the :class:`ObjectStore` seam on any S3-compatible store.

The client is boto3's, configured by the standard AWS settings (``AWS_ENDPOINT_URL``,
``AWS_REGION``, ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``, ``AWS_PROFILE``, ``~/.aws``), so
AWS S3, R2, GCS's S3 API, Ceph, MinIO and SeaweedFS are reached the same way; nothing is signed
by hand. Every key the platform names is relative and lands under the URL's prefix.

A put is atomic in S3 (an object is whole or absent, a multipart upload only visible once it is
completed), which is what the seam promises. What comes back is still treated as untrusted: every
read is bounded by a size the caller names and returns its sha256 to check.

Errors: a missing object is ``FileNotFoundError``; anything else the store or the network says is
:class:`ComputeError`, naming the operation, the key and the store's own code and message, so an
operator reads "InvalidAccessKeyId" or "NoSuchBucket" rather than a stack.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import secrets
from collections.abc import Iterator
from typing import TYPE_CHECKING, BinaryIO, cast
from urllib.parse import urlsplit

import boto3.session
import botocore.config
import botocore.exceptions
from boto3.s3.transfer import TransferConfig

from pgplane.compute.driver import ComputeError
from pgplane.compute.local.shared.objects import (
    Unreachable,
    Written,
    check_key,
    read_or_make_identity,
)

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client
    from mypy_boto3_s3.type_defs import GetObjectOutputTypeDef, ObjectIdentifierTypeDef

_CHUNK = 1 << 20
# Below this one put_object; above it a multipart upload. A stream that cannot seek is buffered a
# part at a time (times the concurrency), so the parts are kept well under the threshold.
_MULTIPART_THRESHOLD = 64 << 20
_PART_SIZE = 16 << 20
_TRANSFER = TransferConfig(
    multipart_threshold=_MULTIPART_THRESHOLD, multipart_chunksize=_PART_SIZE, max_concurrency=4
)
# S3's rules for a bucket's name (the path-style ones: no dots are needed anywhere here).
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_MISSING = frozenset({"NoSuchKey", "404", "NotFound"})
# 412: the condition did not hold; 409: another conditional write of the key is under way (AWS),
# which is as good as losing the race.
_CONDITION_LOST = frozenset({"PreconditionFailed", "412", "ConditionalRequestConflict", "409"})


class S3Store:
    """Objects in ``bucket`` under ``prefix`` (``""`` or ``a/b/``)."""

    def __init__(self, bucket: str, prefix: str, client: S3Client) -> None:
        self.bucket = bucket
        self.prefix = prefix
        self._client = client
        self._identity: str | None = None

    @classmethod
    def from_url(cls, url: str) -> S3Store:
        """``s3://BUCKET`` or ``s3://BUCKET/PREFIX``, with a client from the AWS settings."""
        bucket, prefix = parse_url(url)
        return cls(bucket, prefix, make_client())

    def __repr__(self) -> str:
        return f"S3Store('s3://{self.bucket}/{self.prefix}')"

    @property
    def identity(self) -> str:
        if self._identity is None:  # made with a conditional put: one of two racing wins
            self._identity = read_or_make_identity(self)
        return self._identity

    def known_identity(self, identity: str) -> None:
        """The identity as read before (kept by the caller): a start while the store does not
        answer needs it, and reads it no sooner than the store answers."""
        self._identity = identity

    # -- writing --------------------------------------------------------------------------------

    def write(self, key: str, source: BinaryIO, *, max_bytes: int) -> Written:
        name = self._name(key)
        counted = _CountingReader(source, key, max_bytes)
        with self._call("put", key):
            # A source that goes past max_bytes raises in the middle: a single put is then never
            # sent and a multipart upload is aborted by s3transfer, so nothing is left visible.
            self._client.upload_fileobj(
                cast(BinaryIO, counted), self.bucket, name, Config=_TRANSFER
            )
        return counted.written()

    def write_bytes(self, key: str, data: bytes, *, replace: bool = True) -> Written:
        if replace:
            with self._call("put", key):
                self._client.put_object(Bucket=self.bucket, Key=self._name(key), Body=data)
        else:
            self.put_if_absent(key, data)  # the first one stays
        return Written(len(data), hashlib.sha256(data).hexdigest())

    def put_if_absent(self, key: str, data: bytes) -> bool:
        """Store ``data`` as ``key`` unless an object of that key exists (then False)."""
        with self._condition("put-if-absent", key) as held:
            self._client.put_object(
                Bucket=self.bucket, Key=self._name(key), Body=data, IfNoneMatch="*"
            )
        return held.value

    def put_if_match(self, key: str, data: bytes, etag: str) -> bool:
        """Replace ``key`` with ``data`` only while its ETag is still ``etag`` (else False).

        Enforced by the store (``If-Match`` on PutObject: AWS since 2024-11, SeaweedFS 4.48 as
        tested, MinIO); a store that ignores the header would replace the object regardless,
        which is why the tests check that this one refuses a stale ETag.
        """
        with self._condition("put-if-match", key) as held:
            self._client.put_object(
                Bucket=self.bucket, Key=self._name(key), Body=data, IfMatch=etag
            )
        return held.value

    # -- reading --------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _get(self, key: str, max_bytes: int) -> Iterator[GetObjectOutputTypeDef]:
        """The object's GET response, refused at once when it says it is past ``max_bytes``;
        its body closed after."""
        with self._call("get", key):
            got = self._client.get_object(Bucket=self.bucket, Key=self._name(key))
            try:
                if got.get("ContentLength", 0) > max_bytes:
                    raise ComputeError(f"shared object {key} is larger than {max_bytes} bytes")
                yield got
            finally:
                got["Body"].close()

    def read(self, key: str, sink: BinaryIO, *, max_bytes: int) -> Written:
        digest, size = hashlib.sha256(), 0
        with self._get(key, max_bytes) as got:
            for chunk in got["Body"].iter_chunks(_CHUNK):
                size += len(chunk)
                if size > max_bytes:  # a store that said less than it sends
                    raise ComputeError(f"shared object {key} is larger than {max_bytes} bytes")
                digest.update(chunk)
                sink.write(chunk)
        return Written(size, digest.hexdigest())

    def read_bytes(self, key: str, *, max_bytes: int) -> bytes:
        return self.get_with_etag(key, max_bytes=max_bytes)[0]

    def get_with_etag(self, key: str, *, max_bytes: int) -> tuple[bytes, str]:
        """The object's bytes and its ETag, for a later :meth:`put_if_match`."""
        with self._get(key, max_bytes) as got:
            data = got["Body"].read(max_bytes + 1)
        if len(data) > max_bytes:
            raise ComputeError(f"shared object {key} is larger than {max_bytes} bytes")
        return data, got["ETag"]

    def exists(self, key: str) -> bool:
        try:
            with self._call("head", key):
                self._client.head_object(Bucket=self.bucket, Key=self._name(key))
        except FileNotFoundError:
            return False
        return True

    def sizes(self, prefix: str) -> dict[str, int]:
        return dict(sorted(self._list(prefix)))

    def _list(self, prefix: str) -> Iterator[tuple[str, int]]:
        below = self._name(prefix) + "/"
        pages = self._client.get_paginator("list_objects_v2")
        with self._call("list", prefix):
            for page in pages.paginate(Bucket=self.bucket, Prefix=below):
                for obj in page.get("Contents", ()):
                    key = obj["Key"].removeprefix(self.prefix)
                    if _is_key(key):  # skip what is not ours (another tool's, a probe)
                        yield key, obj["Size"]

    # -- deleting -------------------------------------------------------------------------------

    def delete(self, prefix: str) -> None:
        with self._call("delete", prefix):
            self._client.delete_object(Bucket=self.bucket, Key=self._name(prefix))
        doomed = [key for key, _ in self._list(prefix)]
        for start in range(0, len(doomed), 1000):  # DeleteObjects' limit per request
            batch: list[ObjectIdentifierTypeDef] = [
                {"Key": self._name(k)} for k in doomed[start : start + 1000]
            ]
            with self._call("delete", prefix):
                done = self._client.delete_objects(
                    Bucket=self.bucket, Delete={"Objects": batch, "Quiet": True}
                )
            if errors := done.get("Errors"):
                first = errors[0]
                raise ComputeError(
                    f"s3 delete {first.get('Key', prefix)}: {first.get('Code')}: "
                    f"{first.get('Message')} ({len(errors)} objects not deleted)"
                )

    # -- at start -------------------------------------------------------------------------------

    def check_writable(self) -> None:
        """Put, read back and delete a probe under the prefix; ComputeError with the store's
        own words when any of it fails (the server's start, before it relies on the bucket)."""
        # Not a platform key (a leading dot): keys() never lists it, even if a crash leaves it.
        probe, data = f".pgplane-probe-{secrets.token_hex(6)}", secrets.token_bytes(16)
        name = self.prefix + probe
        try:
            with self._call("put", probe):
                self._client.put_object(Bucket=self.bucket, Key=name, Body=data)
            with self._call("get", probe):
                back = self._client.get_object(Bucket=self.bucket, Key=name)["Body"].read(64)
            with self._call("delete", probe):
                self._client.delete_object(Bucket=self.bucket, Key=name)
        except FileNotFoundError:
            back = b""  # put, then not found: a store that does not keep what it acknowledged
        if back != data:
            raise ComputeError(f"s3 get {probe}: the probe read back is not what was put")

    # -- helpers --------------------------------------------------------------------------------

    def _name(self, key: str) -> str:
        check_key(key)
        return self.prefix + key

    @contextlib.contextmanager
    def _call(self, op: str, key: str) -> Iterator[None]:
        """botocore's errors as FileNotFoundError (no such object) or ComputeError."""
        try:
            yield
        except botocore.exceptions.ClientError as exc:
            code, message = _error(exc)
            if code in _MISSING:
                raise FileNotFoundError(key) from None
            where = f"s3://{self.bucket}/{self.prefix}"
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0
            error = Unreachable if status >= 500 else ComputeError
            raise error(f"s3 {op} {key}: {code}: {message} ({where})") from None
        except botocore.exceptions.BotoCoreError as exc:
            # No credentials, no connection, a timeout: botocore's message says which.
            away = (botocore.exceptions.ConnectionError, botocore.exceptions.HTTPClientError)
            error = Unreachable if isinstance(exc, away) else ComputeError
            raise error(f"s3 {op} {key}: {type(exc).__name__}: {exc}") from None

    @contextlib.contextmanager
    def _condition(self, op: str, key: str) -> Iterator[_Held]:
        held = _Held()
        try:
            with self._call(op, key):
                try:
                    yield held
                except botocore.exceptions.ClientError as exc:
                    if _error(exc)[0] not in _CONDITION_LOST:
                        raise
                    held.value = False
        except FileNotFoundError:
            # If-Match on a key that is gone (AWS says 404): the ETag cannot match.
            held.value = False


class _Held:
    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = True


class _CountingReader:
    """``source`` with what was read counted and hashed, and cut off past ``max_bytes``.

    It has no ``seek``: s3transfer then reads it once, in order, which the digest needs.
    """

    def __init__(self, source: BinaryIO, key: str, max_bytes: int) -> None:
        self._source, self._key, self._max = source, key, max_bytes
        self._digest, self._size = hashlib.sha256(), 0

    def read(self, n: int = -1) -> bytes:
        chunk = self._source.read(n)
        # s3transfer takes a short read for the end (a first read under the multipart threshold
        # makes it one small put): a pipe's short reads are filled up here, or the object would
        # be cut short without an error.
        while n > 0 and 0 < len(chunk) < n and (more := self._source.read(n - len(chunk))):
            chunk += more
        self._size += len(chunk)
        if self._size > self._max:
            raise ComputeError(f"{self._key}: more than {self._max} bytes to store")
        self._digest.update(chunk)
        return chunk

    def written(self) -> Written:
        return Written(self._size, self._digest.hexdigest())


def parse_url(url: str) -> tuple[str, str]:
    """``s3://BUCKET/PREFIX`` as the bucket and the prefix (``""`` or ending in ``/``)."""
    parts = urlsplit(url)
    if parts.scheme != "s3":
        raise ValueError(f"shared storage URL {url!r}: expected s3://BUCKET/PREFIX")
    if parts.query or parts.fragment or "@" in parts.netloc or ":" in parts.netloc:
        raise ValueError(
            f"shared storage URL {url!r}: no credentials, port, query or fragment belong in it "
            "(the endpoint and credentials come from AWS_ENDPOINT_URL and the AWS settings)"
        )
    bucket = parts.netloc
    if _BUCKET.fullmatch(bucket) is None or ".." in bucket:
        raise ValueError(
            f"shared storage URL {url!r}: {bucket!r} is not a bucket name "
            "(3-63 characters: lowercase letters, digits, dots and hyphens)"
        )
    path = parts.path.strip("/")
    if not path:
        return bucket, ""
    try:
        check_key(path)
    except ComputeError:
        raise ValueError(
            f"shared storage URL {url!r}: the prefix {path!r} must be /-separated names of "
            "letters, digits, '.', '_' and '-' (none empty or starting with a dot)"
        ) from None
    return bucket, path + "/"


def make_client() -> S3Client:
    """An S3 client from the AWS settings, with bounded timeouts and retries."""
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    config = botocore.config.Config(
        retries={"mode": "standard", "max_attempts": 5},
        connect_timeout=5,
        read_timeout=60,
        signature_version="s3v4",
        # Path-style (http://host:port/bucket/key) for a store of one's own: SeaweedFS or MinIO
        # at 127.0.0.1 has no DNS name for each bucket. AWS itself chooses ("auto").
        s3={"addressing_style": "path" if endpoint else "auto"},
    )
    return boto3.session.Session().client("s3", config=config)


def _error(exc: botocore.exceptions.ClientError) -> tuple[str, str]:
    err = exc.response.get("Error", {})
    status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    code = err.get("Code") or str(status)
    return code, err.get("Message") or exc.operation_name


def _is_key(key: str) -> bool:
    try:
        check_key(key)
    except ComputeError:
        return False
    return True
