"""A noisy neighbour: another account's pgbench beside a tenant burning CPU and eating memory.

As root (computes sandboxed and in cgroups). Two accounts, one project each, computes of equal
size (``--cu``, 0.5 by default). Rounds interleaved so both sides see the same machine:

- **alone**: B runs ``pgbench`` (TPC-B, 4 clients) through the proxy while A's compute idles;
- **beside A**: the same while A's tenant, superuser on its own compute (made by hand, as a
  CVE would), runs from its shell four busy loops and a memory eater (``tail /dev/zero``, ended
  by the kernel at A's memory limit, started again) for the whole run.

Target: B's tps beside A at least 80% of alone (medians of the rounds).

    sudo .venv/bin/python -m bench.neighbours [--seconds 15] [--rounds 3] [--cu 0.5] [--smoke]
"""

from __future__ import annotations

import argparse
import os
import shlex
import threading
from typing import Any

import psycopg
from psycopg import sql

from bench.common import Api, median, parse_with_smoke, running_server, verdict
from bench.proxy_throughput import pgbench, tps
from pgplane.compute.local.layout import Layout
from pgplane.compute.local.postgres.records import Records
from pgplane.compute.local.postgres.sessions import admin_conninfo


def _project(api: Api, name: str, cu: float) -> dict[str, Any]:
    body = api.create_ready_project(name=name)
    pid, eid = body["project"]["id"], body["endpoints"][0]["id"]
    size = {"autoscaling_limit_min_cu": cu, "autoscaling_limit_max_cu": cu}
    r = api.http.patch(f"/projects/{pid}/endpoints/{eid}", json={"endpoint": size})
    assert r.status_code == 200, r.text
    api.wait_operations(pid, [o["id"] for o in r.json()["operations"]])
    return body


def _uri(body: dict[str, Any]) -> str:
    return str(body["connection_uris"][0]["connection_uri"]).replace(
        "sslmode=require", "sslmode=disable"
    )


def _make_superuser(data_dir: Any, body: dict[str, Any]) -> None:
    """What a Postgres CVE would do, done as cloud_admin on A's own socket."""
    with psycopg.connect(_uri(body)) as conn:
        conn.execute("SELECT 1")  # woken
    pgdata = Layout(data_dir.resolve()).pgdata(body["project"]["id"], body["branch"]["id"])
    running = Records(data_dir.resolve() / "postmasters").get(pgdata)
    assert running is not None
    with psycopg.connect(admin_conninfo(running.socket_dir, running.port)) as conn:
        conn.execute("ALTER ROLE neondb_owner SUPERUSER")
        conn.commit()


def noise_script(seconds: int) -> str:
    """A shell script of four busy loops and a memory eater, for ``seconds``."""
    burn = "while :; do :; done"
    eat = "while :; do tail /dev/zero; done"
    script = f"for i in 1 2 3 4; do timeout {seconds} sh -c '{burn}' & done; "
    return script + f"timeout {seconds} sh -c '{eat}' & wait"


def _noise(uri: str, seconds: int) -> None:
    """:func:`noise_script` from A's shell."""
    program = f"sh -c {shlex.quote(noise_script(seconds))} >/dev/null 2>&1"
    with psycopg.connect(uri, autocommit=True) as conn:
        conn.execute("CREATE TEMP TABLE out (line text)")
        conn.execute(sql.SQL("COPY pg_temp.out FROM PROGRAM {}").format(sql.Literal(program)))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=int, default=15)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cu", type=float, default=0.5)
    args = parse_with_smoke(parser, seconds=2, rounds=1)
    if os.geteuid() != 0:
        print("computes are walled only as root: run this as root")
        return 2
    with running_server() as server:
        _, key_a = server.create_key("noisy@example.com")
        _, key_b = server.create_key("quiet@example.com")
        with Api(server, key_a) as api_a, Api(server, key_b) as api_b:
            a = _project(api_a, "noisy", args.cu)
            b = _project(api_b, "quiet", args.cu)
            _make_superuser(server.data_dir, a)
            password = b["connection_uris"][0]["connection_parameters"]["password"]
            target = _uri(b)
            pgbench(target, password, "-i", "-q", "-s", "4")
            run = ["-c", "4", "-j", "2", "-T", str(args.seconds)]
            alone: list[float] = []
            beside: list[float] = []
            for n in range(args.rounds):
                alone.append(tps(pgbench(target, password, *run)))
                noise = threading.Thread(target=_noise, args=(_uri(a), args.seconds + 2))
                noise.start()
                beside.append(tps(pgbench(target, password, *run)))
                noise.join()
                print(f"round {n + 1}: alone {alone[-1]:.0f} tps, beside A {beside[-1]:.0f} tps")
    ratio = median(beside) / median(alone)
    print(f"B's pgbench at {args.cu} CU, {args.rounds} rounds of {args.seconds} s (medians)")
    print(f"  alone      {median(alone):8.0f} tps")
    print(f"  beside A   {median(beside):8.0f} tps   (A: 4 busy loops and a memory eater)")
    print(f"  ratio      {ratio:8.2f}x (target >= 0.8x)")
    return verdict({"B beside a noisy A >= 0.8x of alone": ratio >= 0.8}, smoke=args.smoke)


if __name__ == "__main__":
    raise SystemExit(main())
