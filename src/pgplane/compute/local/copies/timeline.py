"""Building a new timeline's data directory: template copy, roles and databases, publish.

Everything happens in ``pgdata.tmp`` next to the final ``pgdata``; only a complete, durable
directory is renamed into place, so a crash at any point leaves a temporary directory that the
next attempt removes (after stopping the temporary postmaster it may have left running).
"""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path

from pgplane import failpoints
from pgplane.compute.driver import ComputeError, DatabaseSpec, RoleSpec
from pgplane.compute.local.files import copy_tree, fsync_dir, sync_tree, write_atomic
from pgplane.compute.local.layout import TIMELINE_MARKER
from pgplane.compute.local.postgres.binaries import PgInstall
from pgplane.compute.local.postgres.cluster import create_roles_and_databases
from pgplane.compute.local.postgres.command import postmaster_argv
from pgplane.compute.local.postgres.postmaster import Postmasters
from pgplane.compute.local.tenants import untrusted
from pgplane.compute.local.tenants.cgroups import Limits
from pgplane.compute.local.tenants.ownership import hand_over
from pgplane.compute.local.tenants.user import RunAs

# Only a unix socket in a directory of its own, so any port number will do.
INIT_PORT = 5432
# What fills a new cluster instead of roles and databases (a schema-only branch's restore).
Populate = Callable[[Path, int], Awaitable[None]]


def temporary_pgdata(pgdata: Path) -> Path:
    return pgdata.with_name(f"{pgdata.name}.tmp")


def fresh_socket_dir(socket_dir: Path, run_as: RunAs) -> None:
    shutil.rmtree(socket_dir, ignore_errors=True)
    socket_dir.mkdir(mode=0o700)
    run_as.chown(socket_dir)


async def build_timeline(
    *,
    install: PgInstall,
    run_as: RunAs,
    postmasters: Postmasters,
    template: Path,
    copy_from: Path | None = None,
    pgdata: Path,
    socket_dir: Path,
    hba_file: Path,
    roles: Sequence[RoleSpec],
    databases: Sequence[DatabaseSpec],
    settings: Mapping[str, str] | None = None,
    populate: Populate | None = None,
    limits: Limits | None = None,
) -> None:
    """Create ``pgdata`` as a copy of ``template`` holding ``roles`` and ``databases`` (or
    what ``populate`` puts in it); ``copy_from``: where the template's files are copied from,
    if not the template (its copy staged as the first base state, which the cluster's copy then
    clones); ``settings``: more for the postmaster that creates them (archiving, say);
    ``limits``: the cgroup it runs in, where what ``populate`` runs is the tenant's code (a
    schema's functions)."""
    tmp = temporary_pgdata(pgdata)
    await postmasters.stop(tmp)
    await asyncio.to_thread(shutil.rmtree, tmp, True)
    await copy_tree(copy_from or template, tmp)
    # The template is the shared compute user's; the copy is the project user's alone.
    template_owner = (await asyncio.to_thread(template.stat)).st_uid
    await asyncio.to_thread(hand_over, tmp, {os.geteuid(), template_owner}, run_as)
    await failpoints.reached("create_timeline:copied")

    await asyncio.to_thread(fresh_socket_dir, socket_dir, run_as)
    argv = postmaster_argv(
        install,
        tmp,
        port=INIT_PORT,
        socket_dir=socket_dir,
        listen="",  # no TCP: nobody but us may reach a cluster that is still being built
        # fsync=off is safe here: sync_tree below flushes every file before the directory is
        # published, and a crash before that throws the whole directory away.
        settings={**(settings or {}), "fsync": "off"},
        hba_file=hba_file,
    )
    log_path = pgdata.parent / "create_timeline.log"
    await postmasters.start(
        argv,
        pgdata=tmp,
        port=INIT_PORT,
        socket_dir=socket_dir,
        run_as=run_as,
        log_path=log_path,
        limits=limits,
    )
    try:
        if populate is None:
            await create_roles_and_databases(socket_dir, INIT_PORT, roles, databases)
        else:
            await populate(socket_dir, INIT_PORT)
        # Killed here, the cluster being built is left running: the next attempt stops it.
        await failpoints.reached("create_timeline:populated")
    finally:
        await postmasters.stop(tmp)
        await asyncio.to_thread(shutil.rmtree, socket_dir, True)

    # The copied template files are only in the page cache until now, as is whatever the
    # postmaster wrote with fsync=off.
    await asyncio.to_thread(sync_tree, tmp)
    marker = tmp / TIMELINE_MARKER
    await asyncio.to_thread(write_atomic, marker, b"")
    run_as.chown(marker)
    await failpoints.reached("create_timeline:synced")
    os.replace(tmp, pgdata)
    await asyncio.to_thread(fsync_dir, pgdata.parent)


def completed(pgdata: Path, pg_version: int) -> bool:
    """Whether the timeline at ``pgdata`` was built already (a retry); refuses a stranger's."""
    if (pgdata / TIMELINE_MARKER).is_file():
        check_data_version(pgdata, pg_version)
        return True
    if pgdata.exists():
        raise ComputeError(f"{pgdata} exists but was not completed by pgplane")
    return False


def check_data_version(pgdata: Path, pg_version: int) -> None:
    """Refuse data of another major version. PG_VERSION is the tenant's file: read without
    following a link or blocking on a FIFO, and named in the error only when it is a version
    (its bytes could be another's file, and the error reaches the account)."""
    try:
        data_version = untrusted.read_text(untrusted.under(pgdata, "PG_VERSION"), 16).strip()
    except FileNotFoundError as exc:
        raise ComputeError(f"{pgdata} has no readable PG_VERSION: {exc.strerror}") from None
    except OSError:
        data_version = ""  # a link, a FIFO, a large file: "unreadable" below
    if data_version != str(pg_version):
        shown = data_version if data_version.isdigit() else "unreadable"
        raise ComputeError(f"{pgdata} holds Postgres {shown} data, not {pg_version}")
