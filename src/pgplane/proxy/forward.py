"""The proxy's way to a compute on another node: through that node's door (:mod:`pgplane.nodelink`).

The client has been through every wall of this node's door (allow-list, throttle, password);
the owning node is told the login (endpoint, startup parameters) and the client's address, and
does the rest from its own reads: routes, wakes, dials and logs in. Its answer is the compute's
replies up to ReadyForQuery, or its refusal in the proxy's words; after it, the connection is the
session's, piped as a compute's own would be.
"""

from __future__ import annotations

from pgplane.nodelink import messages
from pgplane.nodelink.client import Door, NodeLink, Unreachable
from pgplane.proxy import wire
from pgplane.proxy.pipe import Closed, Side
from pgplane.proxy.seam import RouteError, Target

# The owning node's answer holds the compute's replies up to ReadyForQuery (login.py bounds them
# at 1 MiB) in a frame.
_MAX_CONNECTED = messages.MAX_ANSWER + 4096


class Moved(Exception):
    """The node asked does not hold the project (any more): route again."""


class Forwarder:
    def __init__(self, link: NodeLink) -> None:
        self._link = link

    async def open(
        self, target: Target, startup: wire.Startup, *, client: str
    ) -> tuple[Side, bytes]:
        """A session on the compute of ``target`` (on another node), logged in; its replies."""
        door = _door(target)
        refused = f"could not connect to endpoint {target.endpoint_id}"
        try:
            side = await self._link.dial(door, Side)
        except Unreachable as exc:
            raise RouteError(wire.CONNECTION_FAILURE, f"{refused}: {exc}; retry") from None
        try:
            side.write(
                messages.frame(
                    messages.Connect(
                        endpoint_id=target.endpoint_id,
                        version=startup.version,
                        params=dict(startup.params),
                        client=client,
                    )
                )
            )
            header = await side.read_exactly(messages.HEADER)
            size = messages.length(header, limit=_MAX_CONNECTED)
            answer = messages.answer(await side.read_exactly(size, limit=_MAX_CONNECTED))
        except (Closed, ConnectionError, messages.MessageError) as exc:
            side.close()
            raise RouteError(
                wire.CONNECTION_FAILURE,
                f"{refused}: node {door.node} ended the connection ({exc or 'closed'}); retry",
            ) from None
        except BaseException:
            side.close()
            raise
        if isinstance(answer, messages.Connected):
            return side, answer.reply
        side.close()
        if isinstance(answer, messages.Refused):
            error = RouteError(answer.code, answer.message)
            error.severity = answer.severity
            raise error
        if isinstance(answer, messages.NotHere):
            raise Moved(answer.message)
        raise RouteError(wire.CONNECTION_FAILURE, f"{refused}: node {door.node} answered oddly")

    async def cancel(self, target: Target, pid: int, key: bytes) -> None:
        """Pass a client's cancel request on to the node whose compute runs the session."""
        side = await self._link.dial(_door(target), Side)
        side.write(messages.frame(messages.Cancel(pid=pid, key=key)))
        side.close()


def _door(target: Target) -> Door:
    if target.down is not None:
        raise RouteError(wire.CONNECTION_FAILURE, target.down)
    if target.via is None:
        raise AssertionError("a target on this node is dialled, not forwarded")
    return target.via
