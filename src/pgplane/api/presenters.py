"""Store records to response models: the one place that decides what a client sees."""

from __future__ import annotations

from typing import Any

from pgplane.api import schemas as s
from pgplane.config import Settings
from pgplane.core.clock import format_s, format_us
from pgplane.core.models import (
    Annotation,
    ApiKey,
    Branch,
    Database,
    Endpoint,
    Operation,
    Project,
    Role,
)
from pgplane.core.operations import Action
from pgplane.core.usage import BranchSizes, StorageTotals, Totals
from pgplane.services.annotations import OBJECT_TYPE
from pgplane.services.anonymized import RESTRICTED_ACTIONS
from pgplane.services.connections import Connection

MIB = 1 << 20
CREATION_SOURCE = "console"
EPOCH_ZERO = "0001-01-01T00:00:00Z"


def _ts(us: int | None) -> str | None:
    return None if us is None else format_s(us)


# Neon's OperationAction enum (its published spec, which its SDKs parse strictly: neon-api's
# operations() raised on anything else) has no snapshot action: a snapshot there is a timeline
# of its own, as here it is a copy of a branch's data. Its creation and deletion are shown as
# that timeline's; the console and the logs keep the platform's own names.
_NEON_ACTIONS = {
    Action.ANONYMIZE: Action.APPLY_CONFIG,  # masking rules applied to the branch
    Action.CREATE_SNAPSHOT: Action.CREATE_TIMELINE,
    Action.DELETE_SNAPSHOT: Action.DELETE_TIMELINE,
}


def operation(op: Operation) -> s.OperationOut:
    return s.OperationOut(
        id=op.id,
        project_id=op.project_id,
        branch_id=op.branch_id,
        endpoint_id=op.endpoint_id,
        # StrEnum members are str; encoded as their value.
        action=_NEON_ACTIONS.get(op.action, op.action),
        status=op.status,
        failures_count=op.failures_count,
        error=op.error,
        retry_at=None if op.retry_at is None else format_us(op.retry_at),
        created_at=format_us(op.created_at),
        updated_at=format_us(op.updated_at),
        total_duration_ms=op.total_duration_ms,
    )


def operations(ops: list[Operation]) -> list[s.OperationOut]:
    return [operation(op) for op in ops]


def api_key_created(key: ApiKey, value: str) -> s.ApiKeyCreated:
    return s.ApiKeyCreated(
        id=key.id,
        key=value,
        name=key.name,
        created_at=format_s(key.created_at),
        created_by=key.created_by,
    )


def api_key_item(key: ApiKey, creator_name: str) -> s.ApiKeyListItem:
    return s.ApiKeyListItem(
        id=key.id,
        name=key.name,
        created_at=format_s(key.created_at),
        created_by=s.ApiKeyCreator(id=key.created_by, name=creator_name, image=""),
        last_used_at=_ts(key.last_used_at),
        last_used_from_addr=key.last_used_from_addr,
    )


def api_key_revoked(key: ApiKey) -> s.ApiKeyRevoked:
    return s.ApiKeyRevoked(
        id=key.id,
        name=key.name,
        created_at=format_s(key.created_at),
        created_by=key.created_by,
        last_used_at=_ts(key.last_used_at),
        last_used_from_addr=key.last_used_from_addr,
        revoked=True,
    )


_NONE = Totals()


def _project_fields(
    p: Project, settings: Settings, used: Totals, stored: StorageTotals | None
) -> dict[str, Any]:
    """The fields a project shows both in lists and on its own."""
    return {
        "id": p.id,
        "platform_id": "local",
        "region_id": p.region_id,
        "name": p.name,
        "provisioner": p.provisioner,
        "default_endpoint_settings": p.default_endpoint_settings,
        "settings": p.settings,
        "pg_version": p.pg_version,
        "proxy_host": settings.proxy_host,
        # The operator's --branch-size-limit, which every compute enforces (0: none).
        "branch_logical_size_limit": settings.branch_size_limit,
        "branch_logical_size_limit_bytes": settings.branch_size_limit * MIB,
        "store_passwords": p.store_passwords,
        "creation_source": CREATION_SOURCE,
        "history_retention_seconds": p.history_retention_seconds,
        "created_at": format_s(p.created_at),
        "updated_at": format_s(p.updated_at),
        "owner_id": p.account_id,
        "locked": p.locked,
        "cpu_used_sec": used.cpu_used_sec,
        "synthetic_storage_size": None if stored is None else stored.synthetic,
    }


def project_item(
    p: Project,
    settings: Settings,
    used: Totals | None = None,
    stored: StorageTotals | None = None,
) -> s.ProjectListItem:
    used = used or _NONE
    return s.ProjectListItem(
        **_project_fields(p, settings, used, stored), active_time=used.active_time_seconds
    )


def project(
    p: Project,
    settings: Settings,
    *,
    owner_email: str,
    used: Totals | None = None,
    stored: StorageTotals | None = None,
) -> s.ProjectOut:
    """``used``: the project's computes' usage since it was made (none is reset: there is no
    billing period), its deleted computes' included, as Neon counts them."""
    used = used or _NONE
    return s.ProjectOut(
        **_project_fields(p, settings, used, stored),
        consumption_period_start=EPOCH_ZERO,
        consumption_period_end=EPOCH_ZERO,
        owner=s.ProjectOwner(
            email=owner_email,
            name=owner_email.split("@", 1)[0],
            branches_limit=settings.branches_per_project,
            subscription_type="UNKNOWN",
        ),
        data_storage_bytes_hour=0 if stored is None else stored.byte_hours,
        data_transfer_bytes=0,
        written_data_bytes=0 if stored is None else stored.written,
        compute_time_seconds=used.compute_time_seconds,
        active_time_seconds=used.active_time_seconds,
        deleted_at=_ts(p.deleted_at),
        on_disk_bytes=None if stored is None else stored.data,
        history_bytes=None if stored is None else stored.history,
    )


def branch(b: Branch, used: Totals | None = None, sizes: BranchSizes | None = None) -> s.BranchOut:
    used = used or _NONE
    return s.BranchOut(
        id=b.id,
        project_id=b.project_id,
        parent_id=b.parent_id,
        parent_lsn=b.parent_lsn,
        parent_timestamp=None if b.parent_timestamp is None else format_s(b.parent_timestamp),
        last_reset_at=None if b.last_reset_at is None else format_s(b.last_reset_at),
        name=b.name,
        current_state=b.current_state,
        pending_state=b.pending_state,
        state_changed_at=format_s(b.state_changed_at),
        creation_source=CREATION_SOURCE,
        primary=b.default,
        default=b.default,
        protected=b.protected,
        cpu_used_sec=used.cpu_used_sec,
        compute_time_seconds=used.compute_time_seconds,
        active_time_seconds=used.active_time_seconds,
        written_data_bytes=0 if sizes is None else sizes.written,
        data_transfer_bytes=0,
        created_at=format_s(b.created_at),
        updated_at=format_s(b.updated_at),
        expires_at=_ts(b.expires_at),
        ttl_interval_seconds=b.ttl_interval_seconds,
        init_source=b.init_source,
        restored_from=b.restored_from,
        restore_status=b.restore_status,
        restored_as=b.restored_as,
        restricted_actions=[
            s.RestrictedAction(name=name, reason=reason) for name, reason in RESTRICTED_ACTIONS
        ]
        if b.anonymized
        else None,
        logical_size=None if sizes is None else sizes.logical,
        on_disk_bytes=None if sizes is None else sizes.data,
        history_bytes=None if sizes is None else sizes.history,
    )


def annotation(branch_id: str, a: Annotation | None) -> s.AnnotationOut:
    """Neon's AnnotationData; a branch with none shows an empty map (no times)."""
    return s.AnnotationOut(
        object=s.AnnotationObject(type=OBJECT_TYPE, id=branch_id),
        value={} if a is None else dict(a.value),
        created_at=None if a is None else format_s(a.created_at),
        updated_at=None if a is None else format_s(a.updated_at),
    )


def endpoint(e: Endpoint, settings: Settings, used: Totals | None = None) -> s.EndpointOut:
    return s.EndpointOut(
        host=settings.endpoint_host(e.id),
        id=e.id,
        project_id=e.project_id,
        branch_id=e.branch_id,
        autoscaling_limit_min_cu=e.autoscaling_limit_min_cu,
        autoscaling_limit_max_cu=e.autoscaling_limit_max_cu,
        region_id=settings.region_id,
        type=e.type,
        current_state=e.current_state,
        pending_state=e.pending_state,
        settings=s.EndpointSettings(pg_settings=dict(e.settings.get("pg_settings", {}))),
        pooler_enabled=False,
        pooler_mode="transaction",
        disabled=e.disabled,
        passwordless_access=False,
        creation_source=CREATION_SOURCE,
        created_at=format_s(e.created_at),
        updated_at=format_s(e.updated_at),
        proxy_host=settings.proxy_host,
        suspend_timeout_seconds=e.suspend_timeout_seconds,
        provisioner="k8s-pod",
        name=e.name,
        last_active=_ts(e.last_active),
        started_at=_ts(e.started_at),
        suspended_at=_ts(e.suspended_at),
        cpu_used_sec=None if used is None else used.cpu_used_sec,
        compute_time_seconds=None if used is None else used.compute_time_seconds,
        active_time_seconds=None if used is None else used.active_time_seconds,
    )


def role(r: Role, *, with_password: bool) -> s.RoleOut:
    return s.RoleOut(
        branch_id=r.branch_id,
        name=r.name,
        protected=r.protected,
        created_at=format_s(r.created_at),
        updated_at=format_s(r.updated_at),
        password=r.password if with_password and r.password else None,
    )


def database(d: Database) -> s.DatabaseOut:
    return s.DatabaseOut(
        id=d.id,
        branch_id=d.branch_id,
        name=d.name,
        owner_name=d.owner_name,
        created_at=format_s(d.created_at),
        updated_at=format_s(d.updated_at),
    )


def connection(c: Connection) -> s.ConnectionDetails:
    return s.ConnectionDetails(
        connection_uri=c.uri,
        connection_parameters=s.ConnectionParameters(
            database=c.database,
            password=c.password,
            role=c.role,
            host=c.host,
            pooler_host=c.host,
            port=c.port,
            options=c.options,
        ),
    )
