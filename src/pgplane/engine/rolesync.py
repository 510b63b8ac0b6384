"""Roles made with SQL, synced from a compute into the store for the proxy (as Neon syncs them).

The proxy authenticates every login before it wakes anything, so it must know the verifier of
every role that may log in, including those a tenant made with ``CREATE ROLE``. Handlers read
them while the compute runs (before a suspend, after roles are applied, from a parent being
branched) and write them with their operation's outcome. Reading is best effort: a compute that
cannot be asked keeps the verifiers synced last, and the proxy reads a running compute directly
for a role it has not seen.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from pgplane.compute.driver import ComputeDriver, ComputeError, ComputeSpec
from pgplane.core.models import Endpoint
from pgplane.store import Tx

log = logging.getLogger(__name__)


async def read(driver: ComputeDriver, spec: ComputeSpec) -> Mapping[str, str] | None:
    """The running compute's login roles; None when it cannot be asked (logged, not raised)."""
    try:
        return await driver.login_roles(spec)
    except ComputeError as exc:
        log.warning("endpoint %s: could not sync its roles: %s", spec.endpoint_id, exc)
        return None


async def write(tx: Tx, *, branch_id: str, verifiers: Mapping[str, str] | None) -> None:
    if verifiers is not None:
        await tx.set_role_verifiers(branch_id=branch_id, verifiers=verifiers)


def branch_compute(endpoints: list[Endpoint], branch_id: str) -> Endpoint | None:
    """The branch's read-write compute, if it has one."""
    return next((e for e in endpoints if e.branch_id == branch_id and e.type == "read_write"), None)
