"""Neon's serverless driver (latest and 0.10.x) and Drizzle's ``neon-http``, unchanged, against a
real server: ``neon()`` over HTTP to the proxy's ``POST /sql`` (tests/js/sqlhttp.cjs).

The driver's default target is ``https://api.<host>/sql`` on port 443; this machine resolves no
``*.localhost`` name and the test server's proxy listens on a port of its own, so the scripts set
``neonConfig.fetchEndpoint`` to the proxy's address: HTTPS with the platform's CA trusted
(``NODE_EXTRA_CA_CERTS``), as an app would, or plain HTTP, which the proxy's one port serves too.
Nothing else of the driver's configuration is changed (but for one run with undici's ``fetch`` as
its ``fetchFunction``, as the README offers); the connection string is the one the API returns.
Each project's compute is asleep first: the first query wakes it.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests import serverless
from tests.support import Api, Server


def _starts(api: Api, pid: str) -> int:
    return sum(o["action"] == "start_compute" for o in api.operations(pid))


def _asleep(api: Api, name: str) -> dict[str, Any]:
    project = api.create_ready_project(name=name)
    api.suspend(project["project"]["id"], project["endpoints"][0]["id"])
    return project


def _run(
    server: Server,
    project: dict[str, Any],
    scenario: str,
    driver: str,
    scheme: str,
    fetch: str = "node",
) -> Any:
    host = "localhost" if scheme == "https" else "127.0.0.1"  # a name the certificate has
    out = serverless.run_http(
        serverless.install(driver),
        scenario,
        uri=project["connection_uris"][0]["connection_uri"],
        fetch_endpoint=f"{scheme}://{host}:{server.proxy_port}/sql",
        ca_file=server.data_dir / "tls" / "ca.crt",
        undici=serverless.install_undici() if fetch == "undici" else None,
    )
    assert "fatal" not in out, out["fatal"]
    return out


@pytest.mark.parametrize(
    ("driver", "scheme", "fetch"),
    [
        (serverless.LATEST, "https", "node"),
        (serverless.OLD, "http", "node"),
        (serverless.LATEST, "https", "undici"),
    ],
)
def test_neon_over_http(server: Server, api: Api, driver: str, scheme: str, fetch: str) -> None:
    project = _asleep(api, "driver-http")
    pid = project["project"]["id"]
    starts = _starts(api, pid)
    out = _run(server, project, "neon", driver, scheme, fetch)
    assert _starts(api, pid) == starts + 1

    assert out["tagged"] == [
        {
            "x": 42,
            "nothing": None,
            "quoted": "it's",
            "arr": [1, 2, 3],
            "at": "2026-01-02T03:04:05.000Z",  # a Date, parsed by the driver from the text
            "j": {"a": 1},
        }
    ]
    assert out["full"] == {
        "command": "SELECT",
        "rowCount": 1,
        "rows": [{"one": 1}],
        "fields": [["one", 23]],
    }
    assert out["arrayMode"] == [[1, "b"]]
    assert out["tx"] == [[], [{"transaction_isolation": "serializable"}], [{"n": 1}]]
    assert out["txError"]["name"] == "NeonDbError"
    assert (out["txError"]["code"], out["txError"]["constraint"]) == ("23505", "items_pkey")
    assert out["afterRollback"] == [{"id": 1}]  # the failed transaction left nothing
    assert out["error"]["code"] == "42703" and out["error"]["position"] == "8"
    assert out["error"]["message"] == 'column "nope" does not exist'
    assert out["query"] == [{"v": "by query()"}]


def test_drizzle_neon_http(server: Server, api: Api) -> None:
    project = _asleep(api, "driver-drizzle")
    out = _run(server, project, "drizzle", serverless.LATEST, "https")
    assert out["selected"] == [{"id": 2, "name": "grace"}]
    assert out["batch"] == [[{"id": 1, "name": "Ada"}], [{"n": "Ada"}, {"n": "grace"}]]
