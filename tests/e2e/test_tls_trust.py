"""Clients that verify the proxy: libpq with ``sslmode=verify-full`` and the platform's CA, and
node-postgres (``pg`` 8, which reads ``sslmode=require`` as verify-full) with the connection URI
the API returns and ``NODE_EXTRA_CA_CERTS``, against a real server, waking suspended computes.

``ep-….localhost`` does not resolve on every machine (it needs systemd-resolved or the like):
libpq is given ``hostaddr=127.0.0.1`` beside the name, and the node script maps names under
``localhost`` to 127.0.0.1 with a ``dns.lookup`` of its own. The name still goes in TLS SNI and
is verified against the certificate, which is what is tested.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psycopg
import pytest

from pgplane.tls import CertPair
from tests import nodepg
from tests.support import Api, Server, run_cli, running_server
from tests.unit.test_tls import _self_signed

# Names under localhost to 127.0.0.1, for machines whose resolver does not (glibc alone does not).
LOOKUP = """
const dns = require("dns");
const systemLookup = dns.lookup;
dns.lookup = (host, options, callback) => {
  if (typeof options === "function") [options, callback] = [{}, options];
  if (!host.endsWith(".localhost")) return systemLookup(host, options, callback);
  const loopback = { address: "127.0.0.1", family: 4 };
  if (options && options.all) return process.nextTick(callback, null, [loopback]);
  process.nextTick(callback, null, "127.0.0.1", 4);
};
"""

QUERY = """
const { Client } = require("pg");
(async () => {
  const client = new Client({ connectionString: process.env.PG_URI });
  try {
    await client.connect();
    const { rows } = await client.query("select current_database() as db, $1::int + 1 as n", [41]);
    console.log(JSON.stringify({ ...rows[0], tls: client.connection.stream.encrypted === true }));
  } catch (err) {
    console.log(JSON.stringify({ error: String(err && err.message), code: err && err.code }));
  } finally {
    await client.end().catch(() => {});
  }
})();
"""


@pytest.fixture(scope="module")
def node_pg() -> Path:
    return nodepg.install()


def _ca(server: Server) -> Path:
    return server.data_dir / "tls" / "ca.crt"


def _node(prefix: Path, uri: str, ca: Path | None) -> dict[str, Any]:
    env = {"PG_URI": uri, "NODE_NO_WARNINGS": "1"}
    if ca is not None:
        env["NODE_EXTRA_CA_CERTS"] = str(ca)
    done = nodepg.run(prefix, LOOKUP + QUERY, env)
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def _starts(api: Api, pid: str) -> int:
    return sum(o["action"] == "start_compute" for o in api.operations(pid))


def test_the_ca_certificate_is_printed_by_the_cli(server: Server) -> None:
    done = run_cli("tls", "ca-cert", data_dir=server.data_dir)
    assert done.returncode == 0, done.stderr
    assert done.stdout == _ca(server).read_text()
    assert done.stdout.startswith("-----BEGIN CERTIFICATE-----")
    where = run_cli("tls", "ca-cert", "--path", data_dir=server.data_dir)
    assert where.stdout.strip() == str(_ca(server))


def test_libpq_verifies_the_proxy_by_endpoint_name(server: Server, api: Api) -> None:
    project = api.create_ready_project(name="verify-full")
    pid, eid = project["project"]["id"], project["endpoints"][0]["id"]
    params = project["connection_uris"][0]["connection_parameters"]
    name, port = project["endpoints"][0]["host"].rsplit(":", 1)
    api.suspend(pid, eid)
    starts = _starts(api, pid)
    by_name = {
        "host": name, "hostaddr": "127.0.0.1", "port": port, "user": params["role"],
        "password": params["password"], "dbname": params["database"], "connect_timeout": 60,
        "sslmode": "verify-full", "sslrootcert": str(_ca(server)), "channel_binding": "require",
    }  # fmt: skip
    # By the endpoint's name (SNI routes it), channel binding on the certificate made for it.
    with psycopg.connect(**by_name) as conn:
        assert conn.execute("select current_database()").fetchone() == ("neondb",)
        assert conn.info.pgconn.ssl_in_use
    assert _starts(api, pid) == starts + 1  # it woke

    # The URI the API returns (the proxy's name, the endpoint in options), verify-full.
    uri = project["connection_uris"][0]["connection_uri"]
    assert urlsplit(uri).hostname == "localhost"
    verified = uri.replace("sslmode=require", "sslmode=verify-full")
    with psycopg.connect(verified, sslrootcert=str(_ca(server)), connect_timeout=30) as conn:
        assert conn.execute("select 1").fetchone() == (1,)


def test_libpq_refuses_a_proxy_it_does_not_trust(server: Server, api: Api, tmp_path: Path) -> None:
    project = api.create_ready_project(name="verify-other")
    uri = project["connection_uris"][0]["connection_uri"]
    other = CertPair(tmp_path / "other" / "proxy.crt", tmp_path / "other" / "proxy.key")
    _self_signed(other)  # another authority than the platform's
    verified = uri.replace("sslmode=require", "sslmode=verify-full")
    with pytest.raises(psycopg.OperationalError, match="certificate verify failed"):
        psycopg.connect(verified, sslrootcert=str(other.cert), connect_timeout=30)


def test_node_postgres_takes_the_returned_uri_with_the_platforms_ca(
    server: Server, api: Api, node_pg: Path
) -> None:
    project = api.create_ready_project(name="node-pg")
    pid, eid = project["project"]["id"], project["endpoints"][0]["id"]
    uri = project["connection_uris"][0]["connection_uri"]
    assert "sslmode=require" in uri
    api.suspend(pid, eid)
    starts = _starts(api, pid)

    # Trusted by nothing without the CA: pg 8 verifies (sslmode=require is verify-full there).
    refused = _node(node_pg, uri, None)
    assert refused.get("code") == "UNABLE_TO_VERIFY_LEAF_SIGNATURE", refused
    assert _starts(api, pid) == starts  # refused before any password: nothing woke

    # The URI as it is, and the platform's CA: in, and the compute woke.
    assert _node(node_pg, uri, _ca(server)) == {"db": "neondb", "n": 42, "tls": True}
    assert _starts(api, pid) == starts + 1

    # By the endpoint's own name (as with wildcard DNS), suspended again: verified for that name.
    api.suspend(pid, eid)
    host = project["endpoints"][0]["host"]
    by_name = uri.replace(f"@{urlsplit(uri).netloc.split('@')[1]}", f"@{host}")
    by_name = by_name.replace(f"&options=endpoint%3D{eid}", "")
    assert urlsplit(by_name).hostname == f"{eid}.localhost", by_name
    assert _node(node_pg, by_name, _ca(server)) == {"db": "neondb", "n": 42, "tls": True}
    assert _starts(api, pid) == starts + 2


def test_an_older_installs_self_signed_certificate_is_replaced_at_start() -> None:
    def older_install(data_dir: Path) -> None:
        _self_signed(CertPair(data_dir / "tls" / "proxy.crt", data_dir / "tls" / "proxy.key"))

    with running_server(prepare=older_install) as server:
        _, key = server.create_key("tls-upgrade@example.com")
        with Api(server, key) as api:
            project = api.create_ready_project(name="tls-upgrade")
            uri = project["connection_uris"][0]["connection_uri"]
            verified = uri.replace("sslmode=require", "sslmode=verify-full")
            with psycopg.connect(verified, sslrootcert=str(_ca(server)), connect_timeout=30) as c:
                assert c.execute("select 1").fetchone() == (1,)
