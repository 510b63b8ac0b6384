"""Fixtures shared by every suite: one real server per session, accounts made with the CLI."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest

from tests.support import Api, Server, running_server

_accounts = itertools.count()


@pytest.fixture(scope="session")
def server() -> Iterator[Server]:
    with running_server() as srv:
        yield srv


@pytest.fixture
def api(server: Server) -> Iterator[Api]:
    """A client of a fresh account, so tests never see each other's objects."""
    _, key = server.create_key(f"user{next(_accounts)}@example.com")
    client = Api(server, key)
    yield client
    client.http.close()


@pytest.fixture
def other_api(server: Server) -> Iterator[Api]:
    """A client of another fresh account."""
    _, key = server.create_key(f"other{next(_accounts)}@example.com")
    client = Api(server, key)
    yield client
    client.http.close()
