"""What the proxy asks of the platform, and the answers it gets: the proxy's seam.

The proxy knows nothing of the store, the engine or the compute driver. The process that runs it
hands it an object satisfying :class:`Computes`; everything crossing the seam is one of the types
below.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from pgplane.proxy.scram import Verifier


@dataclass(frozen=True, slots=True)
class Target:
    """Where an endpoint's running compute accepts clients."""

    endpoint_id: str
    host: str
    port: int
    # The compute's socket file. The proxy always dials it when given: its directory is private
    # to the platform and the project's OS user, so the compute trusts whoever arrives there.
    unix_socket: Path | None = None


@dataclass(frozen=True, slots=True)
class Password:
    """A role the platform manages: its password, which the proxy checks (and may log in with)."""

    password: str


@dataclass(frozen=True, slots=True)
class Known:
    """A role created with SQL on the compute: known by the SCRAM verifier synced from it."""

    verifier: Verifier


Secret = Password | Known


@dataclass(frozen=True, slots=True)
class Route:
    """What the platform tells the proxy about a login to an endpoint, before anything wakes."""

    secret: Secret | None  # None: no such role may log in; refused as a wrong password is
    target: Target | None  # the compute, when the store says it runs; None: wake it


class RouteError(Exception):
    """The endpoint cannot be served; reaches the client as an ErrorResponse (SQLSTATE code)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class Computes(Protocol):
    """What the proxy asks of the platform."""

    async def route(self, endpoint_id: str, role: str) -> Route:
        """The role's secret and the running compute, if any; RouteError for an unknown or
        disabled endpoint. Never wakes, starts or reattaches anything."""
        ...

    async def wake(self, endpoint_id: str, *, force: bool) -> Target:
        """Start the endpoint's compute (or join the start under way) and return it running.

        Only called for a client that has proven its role's password. Without ``force`` a
        compute the store says runs is returned as it is; with it (the compute was found
        unreachable) a start runs regardless.
        """
        ...
