"""``serve``'s own life: one per data directory (a second refuses at once, naming the first's
PID; a killed server's lock never blocks the next start), and what becomes of the computes when
it stops (left running and named, or suspended with ``--stop-computes``)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
from importlib.metadata import version
from pathlib import Path

import httpx
import pytest

from tests.crash import postmasters
from tests.stores import store_sql
from tests.support import PGPLANE, Api, Server, free_port, running_server


def test_a_second_serve_on_the_same_data_directory_refuses_naming_the_holder() -> None:
    with running_server() as server:
        assert server.process is not None
        first = server.process.pid
        # Other ports than the first's, so only the data directory is shared.
        second = subprocess.run(
            [
                *PGPLANE,
                "serve",
                "--data-dir",
                str(server.data_dir),
                "--port",
                str(free_port()),
                "--proxy-port",
                str(free_port()),
            ],
            capture_output=True,
            text=True,
            env=server.env,
            timeout=60,
            check=False,
        )
        assert second.returncode != 0
        assert f"pgplane serve (pid {first}) is already running on" in second.stderr
        assert server.process.poll() is None  # the first one goes on serving
        assert httpx.get(f"{server.base_url}/openapi.json").status_code == 200

        # Killed outright, the first leaves no lock behind: the next start takes it.
        server.stop(signal.SIGKILL)
        server.start()
        assert httpx.get(f"{server.base_url}/openapi.json").status_code == 200


@pytest.mark.parametrize("flag", ["--port", "--proxy-port"])
def test_a_taken_port_fails_the_start_at_once_naming_its_flag(tmp_path: Path, flag: str) -> None:
    """The ports the user chose are bound before anything is made: a taken one was found only
    after the store, the node and its certificate were (a raw "[Errno 98]" for the API's), and
    a port the system chose for something else first (the node door's) could be one of them."""
    data_dir = tmp_path / "data"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        ports = {"--port": str(free_port()), "--proxy-port": str(free_port()), flag: str(port)}
        done = subprocess.run(
            [
                *PGPLANE,
                "serve",
                "--data-dir",
                str(data_dir),
                *(a for p in ports.items() for a in p),
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert done.returncode != 0
    assert f"cannot listen on 127.0.0.1:{port} (" in done.stderr, done.stderr
    assert f"choose another port with {flag}" in done.stderr
    assert not (data_dir / "pgplane.db").exists()  # nothing made: no store


@pytest.mark.parametrize("case", ["tls-cert", "archive-key", "data-dir"])
def test_a_path_that_cannot_serve_fails_the_start_at_once_naming_its_flag(
    tmp_path: Path, case: str
) -> None:
    """A missing --tls-cert was a traceback, after the store, the node and the sandbox were
    made; each path is checked first now, its flag named, nothing made."""
    data_dir = tmp_path / "data"
    loose_key = tmp_path / "archive.key"
    loose_key.write_bytes(os.urandom(32))
    loose_key.chmod(0o644)
    args, said = {
        "tls-cert": (
            ["--tls-cert", str(tmp_path / "none.crt"), "--tls-key", str(tmp_path / "none.key")],
            f"--tls-cert {tmp_path / 'none.crt'}: no such file",
        ),
        "archive-key": (
            ["--object-store", "s3://bucket/prefix", "--archive-key-file", str(loose_key)],
            "--archive-key-file (PGPLANE_ARCHIVE_KEY_FILE): archive key file",
        ),
        "data-dir": ([], f"{loose_key} is not a directory"),
    }[case]
    if case == "data-dir":
        data_dir = loose_key / "data"
    ports = ["--port", str(free_port()), "--proxy-port", str(free_port())]
    done = subprocess.run(
        [*PGPLANE, "serve", "--data-dir", str(data_dir), *ports, *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert said in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "data").exists()  # nothing made


def _suspends(server: Server) -> list[tuple[str, str]]:
    query = "SELECT endpoint_id, status FROM operations WHERE action = 'suspend_compute'"
    return store_sql(server).rows(query)


def test_stopping_names_the_computes_it_leaves_running_and_the_next_start_adopts_them() -> None:
    with running_server() as server:
        _, key = server.create_key("stop@example.com")
        with Api(server, key) as api:
            body = api.create_ready_project()
        project, endpoint = body["project"]["id"], body["endpoints"][0]["id"]
        server.stop()
        assert f"leaving 1 compute(s) running: {endpoint};" in server.log()
        assert sum(postmasters(server.data_dir / "projects").values()) == 1
        assert _suspends(server) == []
        server.start()
        with Api(server, key) as api:
            assert api.endpoint(project, endpoint)["current_state"] == "active"
        assert sum(postmasters(server.data_dir / "projects").values()) == 1  # the same one


def test_stop_computes_suspends_each_one_as_an_operation() -> None:
    with running_server(PGPLANE_STOP_COMPUTES="on") as server:
        _, key = server.create_key("stop@example.com")
        with Api(server, key) as api:
            endpoints = [api.create_ready_project()["endpoints"][0]["id"] for _ in range(2)]
        server.stop()
        suspends = sorted(_suspends(server))
        assert suspends == [(e, "finished") for e in sorted(endpoints)], server.log()[-3000:]
        assert sum(postmasters(server.data_dir / "projects").values()) == 0
        assert "leaving" not in server.log()


def test_version() -> None:
    done = subprocess.run([*PGPLANE, "--version"], capture_output=True, text=True, check=True)
    assert done.stdout == f"pgplane {version('pgplane')}\n"
