"""Schema-only branches: from ``POST /projects/{id}/branches`` (``init_source: schema-only``)
until its create_branch has finished, beside the same schema moved by hand.

The parent holds ``--tables`` tables (each with a serial key, a unique and a plain index, a
check, a default and a comment: what a migration tool makes), its compute running. By hand is
what a user would do with the same binaries: ``CREATE DATABASE`` on the parent's compute, then
``pg_dump --schema-only | psql`` into it, over the compute's own socket. Rounds interleave, in
one run. Target: the branch within 1.2x of the hand-made copy.

The branch does more than the copy by hand (a new cluster from the template, the roles with
their verifiers, the source's catalog read, durable data, its history's first base state) and
restores as the tenant's own roles rather than a superuser.

    .venv/bin/python -m bench.schema_only [--tables 1000] [--runs 3] [--smoke]
"""

from __future__ import annotations

import argparse
import subprocess
import time

import psycopg
from psycopg import sql

from bench.common import Api, Server, median, parse_with_smoke, pg_binary, running_server, verdict
from pgplane.compute.local.layout import Layout
from pgplane.compute.local.postgres.records import Records
from pgplane.compute.local.postgres.sessions import admin_conninfo

TARGET = 1.2


def make_parent(api: Api, tables: int) -> dict:
    body = api.create_ready_project(name="schema-only-bench")
    t0 = time.perf_counter()
    uri = body["connection_uris"][0]["connection_uri"]
    with psycopg.connect(uri, autocommit=True) as conn, conn.transaction():
        for i in range(tables):
            conn.execute(
                sql.SQL(
                    "CREATE TABLE {t} (id serial PRIMARY KEY, name text NOT NULL UNIQUE,"
                    " n int CHECK (n >= 0), created timestamptz DEFAULT now());"
                    " CREATE INDEX ON {t} (created); COMMENT ON TABLE {t} IS {c};"
                    " INSERT INTO {t} (name, n) VALUES ('row', 1)"
                ).format(t=sql.Identifier(f"t{i:04d}"), c=sql.Literal(f"table {i}"))
            )
    print(f"parent: {tables} tables in {time.perf_counter() - t0:.1f} s")
    return body


def by_hand(server: Server, body: dict, round_no: int, *, one_transaction: bool = False) -> float:
    """Seconds for CREATE DATABASE + pg_dump --schema-only | psql on the parent's compute
    (``one_transaction``: ``psql --single-transaction``, one commit rather than one per
    statement)."""
    pid, bid = body["project"]["id"], body["branch"]["id"]
    data_dir = server.data_dir.resolve()
    running = Records(data_dir / "postmasters").get(Layout(data_dir).pgdata(pid, bid))
    assert running is not None, "the parent's compute is not running"
    major = int(body["project"]["pg_version"])
    target = f"by_hand_{round_no}_{int(one_transaction)}"
    source_info = admin_conninfo(running.socket_dir, running.port, "neondb")
    target_info = admin_conninfo(running.socket_dir, running.port, target)
    t0 = time.perf_counter()
    with psycopg.connect(admin_conninfo(running.socket_dir, running.port), autocommit=True) as c:
        c.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(target)))
    dump = subprocess.Popen(
        [pg_binary("pg_dump", major), "--schema-only", "--dbname", source_info],
        stdout=subprocess.PIPE,
    )
    restore = subprocess.run(
        [
            pg_binary("psql", major),
            *(["--single-transaction"] if one_transaction else []),
            *("-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", target_info),
        ],
        stdin=dump.stdout,
        stdout=subprocess.DEVNULL,
        check=False,
    )
    assert dump.wait() == 0 and restore.returncode == 0
    elapsed = time.perf_counter() - t0
    with psycopg.connect(admin_conninfo(running.socket_dir, running.port), autocommit=True) as c:
        c.execute(sql.SQL("DROP DATABASE {}").format(sql.Identifier(target)))
    return elapsed


def schema_only_branch(api: Api, body: dict) -> tuple[float, str]:
    pid = body["project"]["id"]
    t0 = time.perf_counter()
    r = api.http.post(
        f"/projects/{pid}/branches",
        json={"branch": {"init_source": "schema-only"}, "endpoints": []},
    )
    assert r.status_code == 201, r.text
    created = r.json()
    op_id = next(o["id"] for o in created["operations"] if o["action"] == "create_branch")
    while True:
        op = api.http.get(f"/projects/{pid}/operations/{op_id}").json()["operation"]
        if op["status"] == "finished":
            return time.perf_counter() - t0, created["branch"]["id"]
        assert op["status"] != "failed", op
        time.sleep(0.005)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--tables", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=3)
    args = parse_with_smoke(parser, tables=10, runs=1)
    with running_server() as server:
        _, key = server.create_key("bench-schema-only@example.com")
        with Api(server, key) as api:
            body = make_parent(api, args.tables)
            pid = body["project"]["id"]
            hand: list[float] = []
            single: list[float] = []
            ours: list[float] = []
            for round_no in range(args.runs):
                hand.append(by_hand(server, body, round_no))
                single.append(by_hand(server, body, round_no, one_transaction=True))
                elapsed, branch_id = schema_only_branch(api, body)
                ours.append(elapsed)
                r = api.http.delete(f"/projects/{pid}/branches/{branch_id}")
                api.wait_operations(pid, [o["id"] for o in r.json()["operations"]])
                print(
                    f"round {round_no + 1}: by hand {hand[-1]:.2f} s (one transaction"
                    f" {single[-1]:.2f} s), branch {ours[-1]:.2f} s"
                )
    ratio = median(ours) / median(hand)
    print(f"pg_dump --schema-only | psql by hand:  median {median(hand):.2f} s")
    print(f"  the same, psql --single-transaction:  median {median(single):.2f} s")
    print(f"schema-only branch:                    median {median(ours):.2f} s")
    print(f"ratio to one transaction: {median(ours) / median(single):.2f}x (not the target)")
    print(f"ratio: {ratio:.2f}x (target {TARGET}x)")
    checks = {f"schema-only branch within {TARGET}x of by hand": ratio <= TARGET}
    return verdict(checks, smoke=args.smoke)


if __name__ == "__main__":
    raise SystemExit(main())
