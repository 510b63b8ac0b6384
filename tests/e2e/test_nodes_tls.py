"""One certificate authority for every node: three nodes on one PostgreSQL store, and clients that
verify the proxy (``sslmode=verify-full``, ``NODE_EXTRA_CA_CERTS``) through whichever node they
reach, with the authority one node gave them.

Node A comes from its single-node days, with an authority its clients trust already: it becomes
the platform's, so those clients verify every node. Node B had one of its own too: it takes the
platform's, and its log says which file its clients must trust again. A node whose proxy host
the authority's names do not cover is refused at start while the others serve it, and is down at
once (no project goes to it).
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pgplane.tls import ensure_certificate
from pgplane.tls.authority import ensure_authority
from tests import serverless
from tests.nodes import attempts, cli, home, nodes, running_nodes
from tests.support import PGPLANE, Api, Server, free_port, make_data_dir, remove_in_background
from tests.support import run_cli as run_cli_at


@pytest.fixture(scope="module")
def trusted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where node A's clients kept its authority's certificate before it joined a platform."""
    return tmp_path_factory.mktemp("client") / "pgplane-ca.crt"


@pytest.fixture(scope="module")
def servers(trusted: Path) -> Iterator[tuple[Server, Server, Server]]:
    def single_node_days(data_dir: Path) -> None:
        ensure_certificate(data_dir / "tls", "localhost")
        shutil.copyfile(data_dir / "tls" / "ca.crt", trusted)

    def own_authority(data_dir: Path) -> None:
        ensure_authority(data_dir / "tls", "localhost")

    prepare = {"node-a": single_node_days, "node-b": own_authority}
    with running_nodes(3, prepare) as (a, b, c):
        yield a, b, c


@pytest.fixture(scope="module")
def on_c(servers: tuple[Server, Server, Server]) -> Iterator[tuple[Api, dict[str, Any]]]:
    """A project placed on node C, created through node A's API (the others cordoned)."""
    a = servers[0]
    _, key = a.create_key("nodes-tls@example.com")
    with Api(a, key) as api:
        for name in ("node-a", "node-b"):
            cli(a, "nodes", "cordon", name)
        try:
            project = api.create_ready_project(name="verified")
        finally:
            for name in ("node-a", "node-b"):
                cli(a, "nodes", "uncordon", name)
        assert home(servers, project["project"]["id"]) is servers[2]
        yield api, project


def _starts(api: Api, pid: str) -> list[str]:
    return [o["id"] for o in api.operations(pid) if o["action"] == "start_compute"]


def test_the_first_nodes_authority_is_every_nodes(
    servers: tuple[Server, Server, Server], trusted: Path
) -> None:
    a, b, _ = servers
    for node in servers:
        done = run_cli_at("tls", "ca-cert", data_dir=node.data_dir, env=node.env)
        assert done.returncode == 0, done.stderr
        assert done.stdout == trusted.read_text()
        assert (node.data_dir / "tls" / "ca.crt").read_text() == trusted.read_text()
        assert not (node.data_dir / "tls" / "ca.key").exists()  # its key: in the store only
    assert "this node's certificate authority" in a.log() and "is now the platform's" in a.log()
    switched = [line for line in b.log().splitlines() if "of before is replaced" in line]
    assert len(switched) == 1 and str(b.data_dir / "tls" / "ca.crt") in switched[0], b.log()


def test_libpq_verifies_every_node_with_the_authority_node_a_gave(
    servers: tuple[Server, Server, Server], on_c: tuple[Api, dict[str, Any]], trusted: Path
) -> None:
    _, b, c = servers
    api, project = on_c
    pid, eid = project["project"]["id"], project["endpoints"][0]["id"]
    params = project["connection_uris"][0]["connection_parameters"]
    api.suspend(pid, eid)
    before = _starts(api, pid)
    # Through node B (which forwards to C, and wakes it there) and through C itself, by the
    # endpoint's name (SNI), channel binding on the certificate the node showed.
    for node in (b, c):
        by_name = {
            "host": f"{eid}.localhost", "hostaddr": "127.0.0.1", "port": node.proxy_port,
            "user": params["role"], "password": params["password"], "dbname": params["database"],
            "sslmode": "verify-full", "sslrootcert": str(trusted), "channel_binding": "require",
            "connect_timeout": 60,
        }  # fmt: skip
        with psycopg.connect(**by_name) as conn:
            assert conn.execute("SELECT current_database()").fetchone() == ("neondb",)
    woke = [op for op in _starts(api, pid) if op not in before]
    assert len(woke) == 1 and woke[0] in attempts(c)
    # The URI the API returns (the proxy's name, the endpoint in its options), at B's port.
    uri = project["connection_uris"][0]["connection_uri"]
    with psycopg.connect(
        uri, port=b.proxy_port, sslmode="verify-full", sslrootcert=str(trusted), connect_timeout=30
    ) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_the_serverless_driver_verifies_node_b_over_wss(
    servers: tuple[Server, Server, Server], on_c: tuple[Api, dict[str, Any]], trusted: Path
) -> None:
    b = servers[1]
    _, project = on_c
    out = serverless.run(
        serverless.install(serverless.LATEST),
        "pool",
        uri=project["connection_uris"][0]["connection_uri"],
        ws_proxy=f"127.0.0.1:{b.proxy_port}/v2",
        ca_file=trusted,  # NODE_EXTRA_CA_CERTS
    )
    assert out == {"seen": [1, 1], "counts": {"kept": 1, "dropped": 0}, "user": "neondb_owner"}


def test_a_node_outside_the_authoritys_names_is_refused_at_start(
    servers: tuple[Server, Server, Server], trusted: Path
) -> None:
    a = servers[0]
    data_dir = make_data_dir()
    env = {**a.env, "PGPLANE_NODE_NAME": "node-x", "PGPLANE_PROXY_HOST": "db.example.test"}
    argv = [*PGPLANE, "serve", "--data-dir", str(data_dir), "--port", str(free_port())]
    try:
        done = subprocess.run(
            [*argv, "--proxy-port", str(free_port())],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
            check=False,
        )
    finally:
        remove_in_background(data_dir)
    assert done.returncode != 0
    said = done.stderr
    assert "is valid for localhost, 127.0.0.0/8, ::1/128 only" in said, said
    assert "not for this node's proxy host db.example.test" in said, said
    assert "node-a" in said and "--tls-cert" in said, said
    assert nodes(a)["node-x"]["state"] == "down"  # its lease ended as it was refused
    assert (a.data_dir / "tls" / "ca.crt").read_text() == trusted.read_text()
