"""The local data plane: real Postgres postmasters on this machine (DESIGN §3).

One module per concern, as patroni's ``postgresql`` package: ``binaries`` (discovery),
``installs`` (installations made runnable, templates, settings checks), ``user`` (running as
another user), ``users`` (one OS user per project when root), ``ownership`` (handing a tree to
a project's user without following links), ``tenants`` (a project's directories, archive and
removal), ``relocate`` (binaries out of the compute users' reach), ``cluster`` (template, roles
and databases), ``timeline`` (building a root branch's data), ``branch`` (a branch's data as a
copy of its parent's), ``datacopy`` (copying a data directory), ``wal`` (which WAL segments a
copy needs), ``catalog`` (roles and databases of a running cluster), ``sizing`` (compute units
as settings), ``computes`` (endpoint and temporary postmasters), ``postmaster`` (spawn,
readiness, stop), ``pidfile`` (which process serves a data directory), ``layout`` (paths),
``files`` (atomic and durable writes), ``spares`` (files made ahead); ``driver`` is the thin
facade.
"""

from pgplane.compute.local.config import LocalDriverConfig
from pgplane.compute.local.driver import LocalComputeDriver

__all__ = ["LocalComputeDriver", "LocalDriverConfig"]
