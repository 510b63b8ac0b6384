"""This process as a node: registered in the store at start-up, its lease renewed by a heartbeat.

The lease is a row with an expiry, as Patroni's member keys are keys with a TTL: a node that
stops renewing it (killed, cut off from the store) is *down* for every other node once it
expires, and their API refuses its projects' data-plane work with a retryable error until it
returns. Nothing is taken over on expiry: a project's computes and data live on its node.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import uuid
from collections.abc import Sequence
from pathlib import Path

from pgplane.config import Settings
from pgplane.core import clock
from pgplane.core.nodes import ACTIVE, Node, check_name, default_name
from pgplane.errors import Unavailable
from pgplane.services import nodes
from pgplane.store import Store
from pgplane.telemetry.metrics import NO_METRICS, Metrics

log = logging.getLogger(__name__)

_US = 1_000_000


def home(data_dir: Path) -> str:
    """The data directory's own id, made once (a copied directory is the same node)."""
    path = data_dir / "node.id"
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        pass
    made = secrets.token_hex(8)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    with open(fd, "w") as f:
        f.write(made + "\n")
    return made


def node_name(settings: Settings) -> str:
    """``--node-name``, checked, or the default one for the data directory."""
    return check_name(settings.node_name or default_name(settings.data_dir))


class NodeLease:
    def __init__(
        self,
        store: Store,
        settings: Settings,
        metrics: Metrics = NO_METRICS,
        shared_storage: str | None = None,
    ) -> None:
        if not 0 < settings.node_heartbeat_seconds < settings.node_lease_seconds:
            raise ValueError(
                "PGPLANE_NODE_HEARTBEAT_SECONDS must be more than 0 and less than"
                " PGPLANE_NODE_LEASE_SECONDS"
            )
        self._store = store
        self._settings = settings
        self._metrics = metrics
        self._shared = shared_storage
        self.name = node_name(settings)
        # The data directory's id, then this process's: a restart on the same directory takes
        # the name back at once, even from a lease its killed predecessor left running.
        self.instance = f"{home(settings.data_dir)}.{uuid.uuid4().hex[:12]}"
        low, high = settings.compute_ports
        self.capacity = settings.node_capacity or (high - low + 1)
        self.node_address = ""  # its node door's, once it listens
        self.door_certs: tuple[str, ...] = ()  # what opens it (Node.door_certs)

    def _node(self, proxy_port: int, now: int) -> Node:
        s = self._settings
        return Node(
            name=self.name,
            instance=self.instance,
            api_url=f"http://{s.host}:{s.port}",
            proxy_address=f"{s.proxy_listen}:{proxy_port}",
            compute_host=s.compute_host,
            capacity=self.capacity,
            state=ACTIVE,  # a new node's; a known one keeps the state it had
            started_at=now,
            heartbeat_at=now,
            expires_at=now + int(s.node_lease_seconds * _US),
            node_address=self.node_address,
            shared_storage=self._shared,
            door_certs=self.door_certs,
        )

    async def register(self, proxy_port: int) -> None:
        """Take the node's name (raises NameTaken while another live process holds it) and adopt
        the projects of an earlier store, which had no nodes."""
        now = clock.now_us()
        async with self._store.write() as tx:
            adopted = await nodes.register(tx, self._node(proxy_port, now))
        self._metrics.node_heartbeat()
        log.info("node %s registered (capacity %d computes)", self.name, self.capacity)
        if adopted:
            log.info("node %s adopted %d project(s) placed on no node", self.name, adopted)

    async def update_address(
        self, proxy_port: int, node_address: str | None = None, door_certs: Sequence[str] = ()
    ) -> None:
        """The proxy's port, once bound (0 asked the system for one), and the node door's
        address once it listens, with the certificates that open it."""
        if node_address is not None:
            self.node_address = node_address
            self.door_certs = tuple(door_certs)
        now = clock.now_us()
        async with self._store.write() as tx:
            current = await tx.get_node(self.name)
            if current is not None and current.instance == self.instance:
                node = self._node(proxy_port, now)
                await tx.put_node(node)

    async def register_certs(self, door_certs: Sequence[str]) -> None:
        """The certificates that open the node's door from now on (a renewal's new one first).
        Raises Unavailable when the store cannot say so, and NameTaken when another process
        holds the name now: either way the new certificate must not be used."""
        async with self._store.write() as tx:
            held = await tx.set_node_door_certs(
                name=self.name, instance=self.instance, certs=list(door_certs)
            )
        if not held:
            raise nodes.NameTaken(f"node {self.name} is held by another process now")
        self.door_certs = tuple(door_certs)

    async def release(self) -> None:
        """A graceful stop: the lease ends now, so other nodes see this one down at once."""
        now = clock.now_us()
        try:
            async with self._store.write() as tx:
                await tx.renew_node(name=self.name, instance=self.instance, now=now, expires_at=now)
        except Unavailable as exc:
            log.warning("node %s: lease not released: %s", self.name, exc.message)

    async def run(self) -> None:
        """Renew the lease every heartbeat, until cancelled."""
        while True:
            await asyncio.sleep(self._settings.node_heartbeat_seconds)
            await self.beat()

    async def beat(self) -> None:
        now = clock.now_us()
        try:
            async with self._store.write() as tx:
                held = await tx.renew_node(
                    name=self.name,
                    instance=self.instance,
                    now=now,
                    expires_at=now + int(self._settings.node_lease_seconds * _US),
                )
        except Unavailable as exc:
            log.warning("node %s: heartbeat not recorded: %s", self.name, exc.message)
            return
        if not held:
            log.error(
                "node %s: its name is held by another process now (this one's lease lapsed);"
                " stop one of them",
                self.name,
            )
            return
        self._metrics.node_heartbeat()
