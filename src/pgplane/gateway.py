"""The platform's side of the proxy's seam (:mod:`pgplane.proxy.seam`): routes and wakes.

A route says who may log in (the role's password, or the verifier synced from the compute for a
role made with SQL) and whether the compute runs; it never wakes, starts or reattaches anything,
so only a client that proved its password reaches :meth:`ComputeWaker.wake`. A client whose
address the project's IP allow-list does not take is refused as the endpoint is found, in the
same read: before its role is looked up, or the compute asked about it. Many clients
connecting to a suspended compute at once share one ``start_compute``: in this process they
share one wake, and in the store :func:`endpoints.wake` reuses a pending start.

With several nodes, an endpoint whose project is placed on another node is routed to that node's
door (:attr:`Target.via`): the allow-list and the secret are read here as for any endpoint (a
role made with SQL is asked of that node, which asks its compute), and the wake, the dial and the
login are that node's own (:mod:`pgplane.proxy.doors.node`), from its own reads.

This module wires the store, the engine and the compute driver to the proxy; it belongs to the
process entry point, so neither the engine nor the proxy imports the other.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from pathlib import Path

from pgplane.compute.driver import ComputeDriver, ComputeError
from pgplane.config import Settings
from pgplane.core import clock
from pgplane.core.ipallow import AllowList
from pgplane.core.models import Endpoint, Project
from pgplane.core.operations import Status
from pgplane.engine.context import compute_spec
from pgplane.engine.engine import Engine
from pgplane.errors import Conflict, LimitExceeded, Locked, NotFound, Unavailable
from pgplane.nodelink import messages
from pgplane.nodelink.client import Door, NodeLink, Unreachable
from pgplane.proxy import scram, wire
from pgplane.proxy.seam import (
    Known,
    Password,
    Route,
    RouteError,
    Secret,
    Target,
    UnknownEndpoint,
    admit,
)
from pgplane.services import endpoints, names, nodes, project_settings
from pgplane.store import Store, Tx
from pgplane.telemetry.metrics import NO_METRICS, Metrics
from pgplane.telemetry.sparse import Sparse

log = logging.getLogger(__name__)
said = Sparse(log)  # warnings a client's login may cause

# A start may first wait for a reattach of the whole project from the cold archive.
_START_TIME_LIMIT = 600.0
# Asking another node for a role's verifier happens before the client proved anything: short.
_ASK_SECONDS = 5.0
# A role nobody told the platform of is looked up on its running compute, before the client
# proved anything: at most this many at once per endpoint, whatever the driver (the local one
# keeps one session per compute for them), so a stranger's flood of made-up roles never takes
# the compute's connection slots from its owner.
_LOOKUPS_PER_ENDPOINT = 2


class ComputeWaker:
    def __init__(
        self,
        *,
        store: Store,
        engine: Engine,
        driver: ComputeDriver,
        settings: Settings,
        metrics: Metrics = NO_METRICS,
        link: NodeLink | None = None,
    ) -> None:
        self._store = store
        self._link = link  # None: a store of one node, every project here
        self._metrics = metrics
        self._engine = engine
        self._driver = driver
        self._settings = settings  # the account quotas a wake is checked against
        self._waking: dict[str, asyncio.Task[Target]] = {}
        self._lookups: dict[str, asyncio.Semaphore] = {}

    async def route(self, endpoint_id: str, role: str, *, client: str) -> Route:
        async with self._store.read() as tx:
            endpoint, project, target = await self._lookup(tx, endpoint_id)
            allowed = await self._admit(tx, endpoint, project, client)
            running = target is not None
            elsewhere = await self._elsewhere(tx, endpoint)
            # Not running, or its branch's data being replaced (a reset or restore the API
            # answered): no session opened before serves the client, on whatever node (a
            # pooled one of SQL over HTTP would read the data the restore replaces).
            fresh = target is None
            target = elsewhere or target
            # Every answer below is of this endpoint, for this client: only its secret differs.
            routed = functools.partial(
                Route,
                target=target,
                allowed=allowed,
                client=client,
                account=project.account_id,
                fresh=fresh,
            )
            if names.is_reserved_role(role):
                # The platform's own roles (cloud_admin, pgplane_monitor) log in only over the
                # compute's private socket; through the proxy they are refused as unknown roles
                # are.
                return routed(secret=None)
            found = await tx.get_role(branch_id=endpoint.branch_id, name=role)
            synced = None
            if found is None:
                synced = await tx.get_role_verifier(branch_id=endpoint.branch_id, name=role)
        if found is not None:
            # A platform role: its password, whatever the compute holds (the proxy logs in over
            # the trusted socket). One that may not log in is refused as an unknown one is.
            secret: Secret | None = None
            if found.login and found.password:
                secret = Password(found.password)
            return routed(secret=secret)
        if running:
            # Made with SQL, on a compute that runs: its word now, not the last sync's, so a
            # password changed (or a role dropped) with SQL holds from the next login on (asked
            # of the compute's node, when another).
            if elsewhere is not None:
                answered, verifier = await self._ask_node(elsewhere, role)
            else:
                answered, verifier = await self._ask_compute(project, endpoint, role)
            if answered:
                return routed(secret=_known(verifier))
        return routed(secret=_known(synced))

    async def _elsewhere(self, tx: Tx, endpoint: Endpoint) -> Target | None:
        """The endpoint's compute as reached through its project's node, when that is another
        node (None: here, or a store of one node)."""
        if self._link is None:
            return None
        node = await tx.project_node(endpoint.project_id)
        if node is None or node.name == self._link.node:
            return None
        now = clock.now_us()
        down = None if node.up(now) else f"{nodes.down(node, now)}; retry later"
        return Target(
            endpoint_id=endpoint.id,
            via=Door(node=node.name, address=node.node_address, certs=node.door_certs),
            down=down,
        )

    async def _ask_node(self, elsewhere: Target, role: str) -> tuple[bool, str | None]:
        """The role's verifier as the compute's own node reads it from the compute."""
        if self._link is None or elsewhere.via is None or elsewhere.down is not None:
            return False, None
        try:
            answer = await self._link.call(
                elsewhere.via,
                messages.RoleVerifier(endpoint_id=elsewhere.endpoint_id, role=role),
                seconds=_ASK_SECONDS,
            )
        except Unreachable as exc:
            said.warning(  # a stranger's login may cause it: once a minute per endpoint
                elsewhere.endpoint_id,
                "endpoint %s: role %r not asked of its node: %s",
                elsewhere.endpoint_id,
                role,
                exc,
            )
            return False, None
        if isinstance(answer, messages.Verifier):
            return answer.answered, answer.verifier
        return False, None

    async def role_verifier(self, endpoint_id: str, role: str) -> messages.Answer:
        """Another node's question: the verifier of a role made with SQL, as the endpoint's
        running compute here holds it (never a platform role's: those log in only here)."""
        try:
            async with self._store.read() as tx:
                endpoint, project, target = await self._lookup(tx, endpoint_id)
                elsewhere = await self._elsewhere(tx, endpoint)
        except RouteError:
            return messages.Verifier(answered=False)
        if elsewhere is not None and elsewhere.via is not None:
            return messages.NotHere(f"endpoint {endpoint_id} is on node {elsewhere.via.node}")
        if target is None or names.is_reserved_role(role):
            return messages.Verifier(answered=False)
        answered, verifier = await self._ask_compute(project, endpoint, role)
        return messages.Verifier(answered=answered, verifier=verifier)

    async def _admit(self, tx: Tx, endpoint: Endpoint, project: Project, client: str) -> AllowList:
        """The allow-list that applies to the endpoint, once the client's address is on it.

        The list comes with the project the route reads anyway; only a list that applies to
        protected branches alone costs a read more (the endpoint's branch), in the same read.
        """
        protected = True
        if project_settings.protected_only(project.settings):
            branch = await tx.get_branch(project_id=project.id, branch_id=endpoint.branch_id)
            protected = branch is None or branch.protected  # none found: fail closed
        allowed = project_settings.allow_list(project.settings, protected_branch=protected)
        admit(client, allowed)
        return allowed

    async def _ask_compute(
        self, project: Project, endpoint: Endpoint, role: str
    ) -> tuple[bool, str | None]:
        """Whether the running compute answered, and the role's verifier as it holds it (None:
        it has none). Unanswered, the last sync decides."""
        turn = self._lookups.setdefault(endpoint.id, asyncio.Semaphore(_LOOKUPS_PER_ENDPOINT))
        try:
            async with turn:
                verifiers = await self._driver.login_roles(
                    compute_spec(project, endpoint), names=[role]
                )
        except ComputeError as exc:
            said.warning(  # a stranger's login may cause it: once a minute per endpoint
                endpoint.id, "endpoint %s: could not read role %r: %s", endpoint.id, role, exc
            )
            return False, None
        if verifiers is None:
            return False, None  # stopped meanwhile
        return True, verifiers.get(role) or None

    async def wake(self, endpoint_id: str, *, force: bool) -> Target:
        if not force:
            # Read again: another connection's wake may have finished since this one's route.
            async with self._store.read() as tx:
                _, _, target = await self._lookup(tx, endpoint_id)
            if target is not None:
                return target
        task = self._waking.get(endpoint_id)
        if task is None:
            task = asyncio.create_task(self._wake(endpoint_id), name=f"wake {endpoint_id}")
            self._waking[endpoint_id] = task
            task.add_done_callback(lambda _: self._waking.pop(endpoint_id, None))
        return await asyncio.shield(task)

    async def _lookup(self, tx: Tx, endpoint_id: str) -> tuple[Endpoint, Project, Target | None]:
        """The endpoint, and its compute when the store says it runs; RouteError if unusable."""
        endpoint = await tx.find_endpoint(endpoint_id)
        project = None if endpoint is None else await tx.get_project_by_id(endpoint.project_id)
        if endpoint is None or project is None or project.deleted_at is not None:
            raise _unknown(endpoint_id)
        if endpoint.disabled:
            raise _disabled(endpoint_id)
        running = (
            endpoint.current_state == "active"
            and endpoint.pending_state is None
            and project.storage_state == "attached"
        )
        if running and await _replacing(tx, endpoint):
            # The compute still serves the branch's old data until the restore's operation
            # restarts it: a new connection waits for the start queued behind it instead.
            running = False
        return endpoint, project, self._target(endpoint) if running else None

    async def _wake(self, endpoint_id: str) -> Target:
        """The shared start of one endpoint's compute, timed (once, however many clients wait)."""
        began = time.monotonic()
        try:
            target = await self._start(endpoint_id)
        except Exception:
            self._metrics.wake(time.monotonic() - began, failed=True)
            raise
        self._metrics.wake(time.monotonic() - began, failed=False)
        return target

    async def _start(self, endpoint_id: str) -> Target:
        try:
            async with self._store.write() as tx:
                op = await endpoints.wake(tx, endpoint_id=endpoint_id, settings=self._settings)
        except NotFound:
            raise _unknown(endpoint_id) from None
        except Conflict:
            raise _disabled(endpoint_id) from None
        except Locked as exc:  # an anonymized branch not masked yet: nothing was queued
            raise RouteError(wire.CONNECTION_REJECTED, exc.message) from None
        except LimitExceeded as exc:  # the account runs its most: nothing was queued
            raise RouteError(
                wire.CONFIGURATION_LIMIT_EXCEEDED,
                f"compute of endpoint {endpoint_id} cannot be started: {exc.message}",
            ) from None
        except Unavailable as exc:  # the store cannot take the start: say so, as the API does
            raise RouteError(
                wire.CONNECTION_FAILURE,
                f"compute of endpoint {endpoint_id} cannot be started now: {exc.message}",
            ) from None
        self._engine.wake()
        try:
            done = await self._engine.wait_settled(
                project_id=op.project_id, operation_id=op.id, time_limit=_START_TIME_LIMIT
            )
        except TimeoutError:
            raise RouteError(
                wire.CONNECTION_FAILURE,
                f"compute of endpoint {endpoint_id} did not start within {_START_TIME_LIMIT:.0f} s",
            ) from None
        if done is not None and done.status is Status.FAILED:
            raise RouteError(
                wire.CONNECTION_FAILURE,
                f"compute of endpoint {endpoint_id} failed to start: {done.error}",
            )
        async with self._store.read() as tx:
            endpoint = await tx.find_endpoint(endpoint_id)
        if endpoint is None:
            raise _unknown(endpoint_id)
        if endpoint.disabled:
            raise _disabled(endpoint_id)
        return self._target(endpoint)

    def _target(self, endpoint: Endpoint) -> Target:
        address = self._driver.compute_address(endpoint_id=endpoint.id, port=endpoint.port)
        return Target(
            endpoint_id=endpoint.id,
            host=address.host,
            port=address.port,
            unix_socket=Path(address.unix_socket) if address.unix_socket else None,
        )


async def _replacing(tx: Tx, endpoint: Endpoint) -> bool:
    """Whether the endpoint's branch has its data replaced (a reset or restore the API has
    answered, until its operation finishes: the branch is ready again in that same write)."""
    branch = await tx.get_branch(project_id=endpoint.project_id, branch_id=endpoint.branch_id)
    return branch is not None and branch.current_state == "resetting"


def _known(verifier: str | None) -> Secret | None:
    parsed = None if verifier is None else scram.parse_verifier(verifier)
    return None if parsed is None else Known(parsed)


def _unknown(endpoint_id: str) -> RouteError:
    return UnknownEndpoint(endpoint_id)


def _disabled(endpoint_id: str) -> RouteError:
    return RouteError(
        wire.CONNECTION_REJECTED,
        f"endpoint {endpoint_id} is disabled; enable it through the API to connect",
    )
