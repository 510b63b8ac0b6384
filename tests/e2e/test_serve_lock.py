"""One ``serve`` per data directory: a second one refuses at once, naming the first's PID, and a
killed server's lock never blocks the next start."""

from __future__ import annotations

import signal
import subprocess

import httpx

from tests.support import PGPLANE, free_port, running_server


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
