"""The API's direct reads of a project's data (a branch's schema, its history's bounds), served
by the project's node whichever node the request reached.

The data is on the project's node only: a read for a project placed here goes to the driver; one
placed on another node is asked of that node over the node channel (:mod:`pgplane.nodelink`),
which reads it from its own driver and answers with the value or the failure it met, raised here
as the same error, so the API answers alike through every node. A project whose node is down
gets the retryable 503 that names it; one whose node cannot be reached, a 503 saying so.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from pgplane.compute.driver import (
    ComputeDriver,
    ComputeError,
    DatabaseNotFound,
    HistoryBounds,
    Point,
    PointNotInHistory,
    SchemaTooLarge,
)
from pgplane.errors import PgplaneError, Unavailable
from pgplane.nodelink import messages
from pgplane.nodelink.client import Door, NodeLink, Unreachable
from pgplane.services import nodes
from pgplane.store import Store

# How long another node's answer may take: a schema at a point of history rebuilds the branch
# into a temporary directory first, as it would here.
_ASK_SECONDS = 600.0
_RETRY_AFTER = {"Retry-After": "5"}

# The failures a node's answer names, by kind: subclasses before their base.
_FAILURES: tuple[tuple[str, type[ComputeError]], ...] = (
    ("point_not_in_history", PointNotInHistory),
    ("database_not_found", DatabaseNotFound),
    ("schema_too_large", SchemaTooLarge),
    ("compute", ComputeError),
)

DataAsk = messages.HistoryBoundsAsk | messages.SchemaAsk


class _NotHere(Exception):
    pass


class ProjectData:
    def __init__(
        self, store: Store, name: str, driver: ComputeDriver, link: NodeLink | None = None
    ) -> None:
        self._store = store
        self._name = name
        self._driver = driver
        self._link = link

    async def history_bounds(
        self, *, project_id: str, branch_id: str, pg_version: int
    ) -> HistoryBounds:
        door = await self._where(project_id)
        if door is None:
            return await self._driver.history_bounds(
                project_id=project_id, branch_id=branch_id, pg_version=pg_version
            )
        ask = messages.HistoryBoundsAsk(
            project_id=project_id, branch_id=branch_id, pg_version=pg_version
        )
        answer = await self._ask(door, ask, limit=messages.MAX_ANSWER)
        if not isinstance(answer, messages.Bounds):
            raise _unexpected(door, answer)
        return HistoryBounds(
            start_lsn=answer.start_lsn, start_time_us=answer.start_time_us, head_lsn=answer.head_lsn
        )

    async def dump_schema(
        self,
        *,
        project_id: str,
        branch_id: str,
        pg_version: int,
        db_name: str,
        max_bytes: int,
        point: Point | None = None,
    ) -> str:
        door = await self._where(project_id)
        if door is None:
            return await self._driver.dump_schema(
                project_id=project_id,
                branch_id=branch_id,
                pg_version=pg_version,
                db_name=db_name,
                max_bytes=max_bytes,
                point=point,
            )
        ask = messages.SchemaAsk(
            project_id=project_id,
            branch_id=branch_id,
            pg_version=pg_version,
            db_name=db_name,
            max_bytes=max_bytes,
            lsn=None if point is None else point.lsn,
            time_us=None if point is None else point.time_us,
        )
        # The SQL is bounded by max_bytes at its node; the frame around it by a little more.
        answer = await self._ask(door, ask, limit=max_bytes + messages.MAX_ANSWER)
        if not isinstance(answer, messages.Schema):
            raise _unexpected(door, answer)
        return answer.sql

    async def answer(self, ask: DataAsk) -> messages.Answer:
        """Another node's read of a project placed here, answered from this node's driver."""
        try:
            await self._here(ask.project_id)
            if isinstance(ask, messages.HistoryBoundsAsk):
                bounds = await self._driver.history_bounds(
                    project_id=ask.project_id, branch_id=ask.branch_id, pg_version=ask.pg_version
                )
                return messages.Bounds(bounds.start_lsn, bounds.start_time_us, bounds.head_lsn)
            point = None
            if ask.lsn is not None or ask.time_us is not None:
                point = Point(lsn=ask.lsn, time_us=ask.time_us)
            sql = await self._driver.dump_schema(
                project_id=ask.project_id,
                branch_id=ask.branch_id,
                pg_version=ask.pg_version,
                db_name=ask.db_name,
                max_bytes=ask.max_bytes,
                point=point,
            )
            return messages.Schema(sql)
        except _NotHere as exc:
            return messages.NotHere(str(exc))
        except ComputeError as exc:
            kind = next(k for k, cls in _FAILURES if isinstance(exc, cls))
            return messages.Failed(kind, str(exc))
        except PgplaneError as exc:
            return messages.Failed("unavailable", exc.message)

    async def _where(self, project_id: str) -> Door | None:
        """The door of the project's node when it is another (None: here); a down node's
        retryable 503."""
        async with self._store.read() as tx:
            await nodes.require_up(tx, project_id)
            node = await tx.project_node(project_id)
        if node is None or node.name == self._name:
            return None
        if self._link is None:  # cannot be with a PostgreSQL store: each node has a door
            raise Unavailable(f"the project's data is on node {node.name}, not on this one")
        return Door(node=node.name, address=node.node_address, certs=node.door_certs)

    async def _here(self, project_id: str) -> None:
        async with self._store.read() as tx:
            node = await tx.project_node(project_id)
        if node is not None and node.name != self._name:
            raise _NotHere(f"project {project_id} is on node {node.name}, not {self._name}")

    async def _ask(self, door: Door, ask: DataAsk, *, limit: int) -> messages.Answer:
        assert self._link is not None  # noqa: S101 - _where found a door only with a link
        try:
            answer = await self._link.call(door, ask, limit=limit, seconds=_ASK_SECONDS)
        except (Unreachable, messages.MessageError) as exc:
            raise Unavailable(
                f"the project's data is on node {door.node}, which did not answer: {exc};"
                " retry later",
                headers=_RETRY_AFTER,
            ) from None
        if isinstance(answer, messages.Failed):
            raise _failure(answer)
        if isinstance(answer, messages.NotHere):
            raise Unavailable(
                f"the project is moving between nodes ({answer.message}); retry",
                headers=_RETRY_AFTER,
            )
        return answer


def _failure(failed: messages.Failed) -> Exception:
    """The error the answering node met, as its own driver raised it (or the API would)."""
    for kind, cls in _FAILURES:
        if kind == failed.kind:
            return cls(failed.message)
    return Unavailable(failed.message, headers=_RETRY_AFTER)


def _unexpected(door: Door, answer: messages.Answer) -> Unavailable:
    return Unavailable(f"node {door.node} answered a read with {type(answer).__name__}")


class NodeAnswers:
    """This node's answers to other nodes' questions (the node door's
    :class:`~pgplane.proxy.doors.node.Answers`): a role's verifier from the gateway, the data
    reads from :class:`ProjectData`."""

    def __init__(
        self, data: ProjectData, verifier: Callable[[str, str], Awaitable[messages.Answer]]
    ) -> None:
        self._data = data
        self._verifier = verifier

    async def __call__(
        self, request: messages.RoleVerifier | messages.HistoryBoundsAsk | messages.SchemaAsk
    ) -> messages.Answer:
        if isinstance(request, messages.RoleVerifier):
            return await self._verifier(request.endpoint_id, request.role)
        return await self._data.answer(request)
