"""The store's statements, one method of the contract each, one mixin per aggregate.

Written once for both backends (see :mod:`pgplane.store.sqlite.common`).
"""

from __future__ import annotations

from pgplane.core.models import Operation
from pgplane.store.base import Tx
from pgplane.store.sqlite.accounts import AccountsMixin, ApiKeysMixin
from pgplane.store.sqlite.annotations import AnnotationsMixin
from pgplane.store.sqlite.branches import BranchesMixin
from pgplane.store.sqlite.common import Conn
from pgplane.store.sqlite.console import ConsoleMixin
from pgplane.store.sqlite.endpoints import EndpointsMixin
from pgplane.store.sqlite.masking import MaskingMixin
from pgplane.store.sqlite.nodes import NodesMixin
from pgplane.store.sqlite.operations import OperationsMixin
from pgplane.store.sqlite.projects import ProjectsMixin
from pgplane.store.sqlite.roles import DatabasesMixin, RolesMixin
from pgplane.store.sqlite.snapshots import SnapshotsMixin
from pgplane.store.sqlite.usage import UsageMixin
from pgplane.store.sqlite.verifiers import RoleVerifiersMixin


class SqliteTx(
    AccountsMixin,
    ApiKeysMixin,
    ConsoleMixin,
    ProjectsMixin,
    BranchesMixin,
    AnnotationsMixin,
    MaskingMixin,
    EndpointsMixin,
    RolesMixin,
    RoleVerifiersMixin,
    DatabasesMixin,
    OperationsMixin,
    SnapshotsMixin,
    UsageMixin,
    NodesMixin,
    Tx,
):
    def __init__(self, conn: Conn) -> None:
        self._c = conn
        self.queued: list[Operation] = []  # operations inserted, said once committed
