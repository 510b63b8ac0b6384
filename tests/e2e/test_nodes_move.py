"""Projects moving between two nodes through shared storage (one PostgreSQL store, and one
shared directory, as NFS would be, or one object store, a real SeaweedFS): a node drained moves
its projects with their data byte for byte and their connection strings unchanged; a node killed
for good has its projects brought back on the other by `pgplane nodes recover`, with every row
committed and shipped before it died.

Each project is reached through its own node's proxy (forwarding between nodes is not asked of
these tests): the URIs are the ones node-b's API gives, taken before the move and used after.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pgplane.compute.local.cold.archive import tree_checksums
from pgplane.compute.local.shared.objects import DirectoryStore, ObjectStore
from pgplane.compute.local.shared.s3 import S3Store
from pgplane.compute.local.shared.sealed import SealedStore
from pgplane.compute.local.shared.shipping import prefix_of, read_head
from tests.nodes import cli, home, home_of_new, nodes, running_nodes, wait_down
from tests.objectstore import SeaweedFS
from tests.support import Api, Server, run_cli, wait_for

ENV = {
    "PGPLANE_SHIP_SECONDS": "0.3",
    "PGPLANE_ARCHIVE_TIMEOUT_SECONDS": "1",
    "PGPLANE_SCHEDULER_SECONDS": "0.2",
    "PGPLANE_RETRY_BASE_SECONDS": "0.2",
}


class Storage:
    """Where the nodes ship: a shared directory, or a bucket of a real SeaweedFS (sealed)."""

    def __init__(self, kind: str, top: Path) -> None:
        self.kind, self.top = kind, top
        self.env = {"PGPLANE_SHARED_DIR": str(top)}
        self._store: ObjectStore = DirectoryStore(top)
        self._seaweed: SeaweedFS | None = None
        if kind == "object store":
            self._seaweed = seaweed = SeaweedFS(top / "seaweedfs")
            seaweed.start()
            key = top / "archive.key"
            key.write_bytes(os.urandom(32))
            key.chmod(0o600)
            self._client = seaweed.client()
            self._store = SealedStore(
                S3Store(seaweed.bucket, "nodes/", self._client), key.read_bytes()
            )
            self.env = {
                **seaweed.env(),
                "PGPLANE_OBJECT_STORE": seaweed.url("nodes"),
                "PGPLANE_ARCHIVE_KEY_FILE": str(key),
                "PGPLANE_OBJECT_SHIP_SECONDS": ENV["PGPLANE_SHIP_SECONDS"],
                "PGPLANE_OBJECT_ARCHIVE_TIMEOUT_SECONDS": ENV["PGPLANE_ARCHIVE_TIMEOUT_SECONDS"],
            }

    def shipped(self, project_id: str, branch_id: str) -> dict[str, str]:
        head = read_head(self._store, prefix_of(project_id, branch_id))
        return {} if head is None else dict(head.wal)

    def archived(self, project_id: str) -> bool:
        return self._store.exists(f"archive/{project_id}/manifest.json")

    def close(self) -> None:
        if self._seaweed is not None:
            self._client.close()
            self._seaweed.stop()
        shutil.rmtree(self.top, ignore_errors=True)


class Pair:
    def __init__(self, a: Server, b: Server, storage: Storage) -> None:
        self.a, self.b, self.storage = a, b, storage
        _, key = a.create_key("moves@example.com")
        self.api_a, self.api_b = Api(a, key), Api(b, key)

    def project_on_a(self, name: str) -> dict[str, Any]:
        """A ready project placed on node-a (node-b cordoned while it is made)."""
        cli(self.a, "nodes", "cordon", "node-b")
        try:
            body = self.api_a.create_ready_project(name=name)
        finally:
            cli(self.a, "nodes", "uncordon", "node-b")
        assert home((self.a, self.b), body["project"]["id"]) is self.a
        return body

    def uri(self, project_id: str, api: Api | None = None) -> str:
        r = (api or self.api_b).http.get(
            f"/projects/{project_id}/connection_uri",
            params={"role_name": "neondb_owner", "database_name": "neondb"},
        )
        assert r.status_code == 200, r.text
        return str(r.json()["uri"])


@pytest.fixture(scope="module", params=["directory", "object store"])
def pair(request: pytest.FixtureRequest) -> Iterator[Pair]:
    storage = Storage(request.param, Path(tempfile.mkdtemp(prefix="pgplane-test-shared-")))
    try:
        with running_nodes(2, **storage.env, **ENV) as (a, b):
            p = Pair(a, b, storage)
            yield p
            p.api_a.http.close()
            p.api_b.http.close()
    finally:
        storage.close()


def contents(uri: str) -> tuple[int, str]:
    """The table's rows, and a digest of all of them in order."""
    with psycopg.connect(uri, connect_timeout=60) as conn:
        row = conn.execute(
            "SELECT count(*), md5(string_agg(v::text || ':' || t, ',' ORDER BY v)) FROM t"
        ).fetchone()
    assert row is not None
    return int(row[0]), str(row[1])


def fill(uri: str, rows: int = 3000) -> None:
    with psycopg.connect(uri, connect_timeout=60) as conn:
        conn.execute(
            "CREATE TABLE t AS SELECT g AS v, md5(g::text) AS t FROM generate_series(1, %s) g",
            [rows],
        )


def data_checksums(server: Server, project_id: str) -> dict[str, str]:
    branches = server.data_dir / "projects" / project_id / "branches"
    return {
        f"{branch.name}/{path}": digest
        for branch in sorted(branches.iterdir())
        for path, digest in tree_checksums(branch / "pgdata").items()
    }


def test_a_drained_node_moves_its_projects_byte_for_byte(pair: Pair) -> None:
    a, b = pair.a, pair.b
    # One project with its computes suspended (its data compared file by file), one whose
    # compute runs through the drain (suspended, moved, started again).
    still = pair.project_on_a("still")
    busy = pair.project_on_a("busy")
    still_id, busy_id = still["project"]["id"], busy["project"]["id"]
    # A second branch, so a project moves whole.
    r = pair.api_a.http.post(
        f"/projects/{still_id}/branches",
        json={"branch": {"name": "dev"}, "endpoints": [{"type": "read_write"}]},
    )
    dev = pair.api_a.settled(still_id, r)
    for body in (still, busy):
        fill(pair.uri(body["project"]["id"], pair.api_a))
    uris = {pid: pair.uri(pid) for pid in (still_id, busy_id)}  # node-b's, before the move
    before = {pid: contents(pair.uri(pid, pair.api_a)) for pid in (still_id, busy_id)}
    for endpoint in (still["endpoints"][0], dev["endpoints"][0]):
        pair.api_a.suspend(still_id, endpoint["id"])
    files = data_checksums(a, still_id)

    done = run_cli("nodes", "drain", "node-a", "--timeout", "300", data_dir=a.data_dir, env=a.env)
    assert done.returncode == 0, done.stdout + done.stderr + a.log()[-3000:]
    moved = [json.loads(line) for line in done.stdout.splitlines()]
    assert {m["project_id"]: m["moved_to"] for m in moved if "moved_to" in m} == {
        still_id: "node-b",
        busy_id: "node-b",
    }

    listed = nodes(b)
    assert (listed["node-a"]["state"], listed["node-a"]["projects"]) == ("draining", 0)
    assert listed["node-b"]["projects"] == 2
    for pid in (still_id, busy_id):
        assert home((a, b), pid) is b
        ops = [o for o in pair.api_b.operations(pid) if o["action"].startswith("tenant_")]
        assert [(o["action"], o["status"]) for o in reversed(ops)] == [
            ("tenant_detach", "finished"),
            ("tenant_reattach", "finished"),
        ]
    # The same bytes, every file of both branches; the same rows through the same URI.
    assert data_checksums(b, still_id) == files
    for pid in (still_id, busy_id):
        assert pair.uri(pid) == uris[pid]
        assert contents(uris[pid]) == before[pid]
    # The compute that ran before runs again, on node-b.
    endpoint = pair.api_b.endpoint(busy_id, busy["endpoints"][0]["id"])
    assert endpoint["current_state"] == "active"
    # Nothing of them is left on node-a, or in the archive on shared storage.
    assert not (a.data_dir / "archive" / still_id).exists()
    assert not pair.storage.archived(still_id)
    # A draining node takes no new project.
    body = pair.api_a.create_project(name="after-drain")
    assert home_of_new((a, b), body) is b
    cli(a, "nodes", "uncordon", "node-a")


def test_a_dead_nodes_projects_come_back_from_shared_storage(pair: Pair) -> None:
    a, b = pair.a, pair.b
    body = pair.project_on_a("lost")
    pid, branch_id = body["project"]["id"], body["branch"]["id"]
    fill(pair.uri(pid, pair.api_a), rows=2000)
    uri = pair.uri(pid)  # node-b's, before node-a dies
    with psycopg.connect(pair.uri(pid, pair.api_a), connect_timeout=60) as conn:
        conn.execute("INSERT INTO t SELECT g, 'late' FROM generate_series(2001, 2500) g")
        (segment,) = conn.execute(
            "SELECT pg_walfile_name(pg_current_wal_insert_lsn())"
        ).fetchone() or ("",)
    wanted = contents(pair.uri(pid, pair.api_a))
    # Every row above is in that segment or an earlier one: once it is shipped, node-a dies.
    wait_for(
        f"segment {segment} shipped",
        lambda: segment in pair.storage.shipped(pid, branch_id),
        server=a,
    )

    refused = run_cli("nodes", "recover", "node-a", data_dir=b.data_dir, env=b.env)
    assert refused.returncode == 2 and "node-a is up" in refused.stderr, refused.stderr
    a.stop(signal.SIGKILL)  # for good: never started again
    wait_down(b, "node-a")
    done = run_cli("nodes", "recover", "node-a", "--to", "node-b", data_dir=b.data_dir, env=b.env)
    assert done.returncode == 0, done.stderr
    assert [p["project_id"] for p in json.loads(done.stdout)["projects"]] == [pid]

    ops = pair.api_b.wait_operations(
        pid, [o["id"] for o in pair.api_b.operations(pid) if o["action"] == "tenant_attach"], 180
    )
    assert [o["status"] for o in ops] == ["finished"], (ops, b.log()[-4000:])
    assert contents(uri) == wanted
    assert nodes(b)["node-b"]["projects"] >= 1
    # It goes on: written to, branched on its new node.
    with psycopg.connect(uri, connect_timeout=60) as conn:
        conn.execute("INSERT INTO t VALUES (0, 'after')")
    r = pair.api_b.http.post(f"/projects/{pid}/branches", json={"branch": {"name": "after"}})
    pair.api_b.settled(pid, r)
