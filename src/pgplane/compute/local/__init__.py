"""The local data plane: real Postgres postmasters on this machine (DESIGN §3).

A subpackage per concern, as patroni's ``postgresql`` package is a module per concern:

- ``postgres``: installations and templates, postmasters and their identity (the platform's own
  records, never a tenant's pid file), the platform's sessions on a compute (roles and databases,
  checks, SCRAM verifiers), compute units as settings;
- ``copies``: a new timeline from the template, a branch's data as a copy of its parent's, spare
  files made ahead;
- ``history``: each branch's archived WAL and base states, rebuilds at a point, the keeper;
- ``cold``: the cold archive of a detached project;
- ``tenants``: each project's OS user, directories and ownership, and the walls around its
  computes: the sandbox, cgroups, and the one reader of files a tenant can write.

``layout`` (paths) and ``files`` (atomic and durable writes) serve them all; ``driver`` is the
thin facade.
"""

from pgplane.compute.local.config import LocalDriverConfig
from pgplane.compute.local.driver import LocalComputeDriver

__all__ = ["LocalComputeDriver", "LocalDriverConfig"]
