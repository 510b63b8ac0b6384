"""What the proxy asks of the platform, and the answers it gets: the proxy's seam.

The proxy knows nothing of the store, the engine or the compute driver. The process that runs it
hands it an object satisfying :class:`Computes`; everything crossing the seam is one of the types
below.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from pgplane.core.ipallow import ALLOW_ALL, AllowList, client_address
from pgplane.nodelink.client import Door
from pgplane.proxy import wire
from pgplane.proxy.scram import Verifier


@dataclass(frozen=True, slots=True)
class Target:
    """Where an endpoint's running compute accepts clients, or the node whose it is."""

    endpoint_id: str
    host: str = ""
    port: int = 0
    # The compute's socket file. The proxy always dials it when given: its directory is private
    # to the platform and the project's OS user, so the compute trusts whoever arrives there.
    unix_socket: Path | None = None
    # The project is placed on another node: its compute is reached through that node's door
    # (host, port and socket are empty), which routes, wakes and logs in itself.
    via: Door | None = None
    # The node is down (its lease lapsed, as the store says): not dialled; the message says so.
    down: str | None = None


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
    # The project's IP allow-list as it applies to this endpoint; the route was given only if
    # the client's address is on it. Kept for what the client does later (a cancel request).
    allowed: AllowList = ALLOW_ALL
    client: str = ""  # the address the route was given for (the client's, whatever door)
    account: str = ""  # whose the endpoint is: what shares of the proxy's pools are counted by
    # No session opened before serves it (its compute is down, or its branch's data is being
    # replaced by a reset or restore): SQL over HTTP takes no pooled connection.
    fresh: bool = False


class RouteError(Exception):
    """The endpoint cannot be served; reaches the client as an ErrorResponse (SQLSTATE code)."""

    severity = "FATAL"

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class UnknownEndpoint(RouteError):
    """No such endpoint (or its project is deleted)."""

    def __init__(self, endpoint_id: str) -> None:
        super().__init__(wire.CONNECTION_REJECTED, f"endpoint {endpoint_id} not found")


class AddressNotAllowed(RouteError):
    """The client's address is not on the project's IP allow-list (``settings.allowed_ips``).

    Neon's words, SQLSTATE and severity (proxy/src/auth/mod.rs, ``IpAddressNotAllowed``), but
    for where the list is kept: Neon's console there, the project's settings here.
    """

    severity = "ERROR"

    def __init__(self, client: str) -> None:
        address = client_address(client)
        super().__init__(
            wire.INTERNAL_ERROR,
            f"This IP address {address or client} is not allowed to connect to this endpoint."
            " Please add it to the allowed list in the project's settings"
            " (settings.allowed_ips; neonctl ip-allow add)."
            " Make sure to check for IPv4 or IPv6 addresses.",
        )


def admit(client: str, allowed: AllowList) -> None:
    """The allow-list check, one for every door (Postgres today; HTTP and WebSocket to come):
    each door hands its client's address to :meth:`Computes.route`, which calls this as soon as
    it has the endpoint's list. AddressNotAllowed unless ``client`` is on ``allowed``."""
    if not allowed.allows(client):
        raise AddressNotAllowed(client)


class Computes(Protocol):
    """What the proxy asks of the platform."""

    async def route(self, endpoint_id: str, role: str, *, client: str) -> Route:
        """The role's secret and the running compute, if any (or, for a project placed on
        another node, that node's door: :attr:`Target.via`); RouteError for an unknown or
        disabled endpoint, AddressNotAllowed (see :func:`admit`) for a ``client`` address the
        project's allow-list does not take, found with the endpoint and before anything of the
        role is looked up. Never wakes, starts or reattaches anything."""
        ...

    async def wake(self, endpoint_id: str, *, force: bool) -> Target:
        """Start the endpoint's compute (or join the start under way) and return it running.

        Only called for a client that has proven its role's password. Without ``force`` a
        compute the store says runs is returned as it is; with it (the compute was found
        unreachable) a start runs regardless.
        """
        ...
