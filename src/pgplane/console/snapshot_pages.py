"""A project's snapshots: take one of a branch (now, or as it was at a time), list them, rename,
set when one is deleted, delete, restore one into a new branch or onto a branch; and a branch's
backup schedule.

As every console action, each calls the service the API route calls (services/snapshots.py,
services/backups.py), scoped to the signed-in account, in one write transaction; another
account's project, branch or snapshot is the API's 404.
"""

from __future__ import annotations

from typing import Any

from litestar import Controller, get, post
from litestar.params import FromPath, FromQuery
from litestar.response import Redirect, Template

from pgplane.console.pages import (
    EXPIRY_CHOICES,
    expires_at,
    form,
    history_bounds,
    page,
    point_at,
    unsettled,
)
from pgplane.console.session import PREFIX, AnyRequest, SignedIn, signed_in
from pgplane.console.usage_view import size
from pgplane.errors import BadRequest, NotFound
from pgplane.services import backups, branches, operations, projects, snapshots

RECENT_OPERATIONS = 10
# The schedule form's fields: a day where the frequency takes one, and its range.
_DAYS = {"weekly": (1, 7), "monthly": (1, 31)}
WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
# Kept in whole days on the form: the API's range is 1 hour to 35 days (Neon's maximum).
MAX_RETENTION_DAYS = backups.DEFAULT_RETENTION_SECONDS // 86_400
_DAY = 86_400


def _project_path(project_id: str) -> str:
    return f"{PREFIX}/projects/{project_id}"


def _number(fields: dict[str, str], field: str, low: int, high: int, default: int) -> int:
    """A whole number the form sent, within its range; a 400 naming the field otherwise."""
    text = fields.get(field, "").strip()
    if not text:
        return default
    if not text.isdigit() or not low <= int(text) <= high:
        raise BadRequest(f"{field} must be a whole number from {low} to {high}, not {text[:20]!r}")
    return int(text)


def schedule_entries(fields: dict[str, str]) -> list[backups.Entry]:
    """The schedule the form describes: an entry for each frequency ticked."""
    entries = []
    for frequency in backups.FREQUENCIES:
        if not fields.get(frequency):
            continue
        low, high = _DAYS.get(frequency, (0, 0))
        day = _number(fields, f"{frequency}_day", low, high, 1) if frequency in _DAYS else None
        hour = _number(fields, f"{frequency}_hour", 0, 23, 0)
        days = _number(fields, f"{frequency}_retention_days", 1, MAX_RETENTION_DAYS, 35)
        entries.append(backups.entry(frequency, hour, day, days * _DAY))
    return entries


def _kept(seconds: int) -> str:
    for unit, length in (("day", _DAY), ("hour", 3600)):
        if seconds % length == 0:
            n = seconds // length
            return f"{n} {unit}{'s' if n != 1 else ''}"
    return f"{seconds} seconds"


def schedule_text(schedule: list[dict[str, Any]]) -> str:
    """The schedule as a sentence (every entry, the API's too when it set several)."""
    parts = []
    for e in schedule:
        on = ""
        if e["frequency"] == "weekly":
            on = f" on {WEEKDAYS[int(e.get('day', 1)) - 1]}"
        elif e["frequency"] == "monthly":
            on = f" on day {e.get('day', 1)}"
        at = f"{int(e.get('hour', 0)):02d}:00 UTC"
        kept = _kept(int(e.get("retention_seconds", backups.DEFAULT_RETENTION_SECONDS)))
        parts.append(f"{str(e['frequency']).capitalize()}{on} at {at}, kept {kept}")
    return "; ".join(parts) or "No scheduled snapshots."


class SnapshotsPage(Controller):
    path = f"{PREFIX}/projects/{{project_id:str}}"

    @get("/snapshots")
    async def show(
        self, request: AnyRequest, project_id: FromPath[str], branch: FromQuery[str] = ""
    ) -> Template:
        context = await _context(signed_in(request), project_id, branch)
        fragment = request.headers.get("x-pgplane-fragment")
        return page(request, "snapshots_live.html" if fragment else "snapshots.html", **context)

    @post("/branches/{branch_id:str}/snapshot")
    async def take(
        self, request: AnyRequest, project_id: FromPath[str], branch_id: FromPath[str]
    ) -> Redirect:
        me = signed_in(request)
        fields = await form(request)
        spec = snapshots.NewSnapshot(
            point=point_at(fields, "timestamp"),
            name=fields.get("name") or None,
            expires_at=expires_at(fields.get("expires_in", "")),
        )
        bounds = None
        if spec.point is not None:
            bounds = await history_bounds(
                me,
                project_id,
                lambda tx: snapshots.branch_of(
                    tx, account_id=me.account_id, project_id=project_id, branch_id=branch_id
                ),
            )
        async with me.console.store.write() as tx:
            await snapshots.create(
                tx,
                account_id=me.account_id,
                project_id=project_id,
                branch_id=branch_id,
                spec=spec,
                bounds=bounds,
            )
        return _to_snapshots(me, project_id, branch_id)

    @post("/branches/{branch_id:str}/backup_schedule")
    async def set_schedule(
        self, request: AnyRequest, project_id: FromPath[str], branch_id: FromPath[str]
    ) -> Redirect:
        """Replace the branch's schedule (none ticked stops it), as the API's PUT does."""
        me = signed_in(request)
        entries = schedule_entries(await form(request))
        async with me.console.store.write() as tx:
            await backups.set_(
                tx,
                account_id=me.account_id,
                project_id=project_id,
                branch_id=branch_id,
                entries=entries,
            )
        return _to_snapshots(me, project_id, branch_id)

    @post("/snapshots/{snapshot_id:str}/{action:str}")
    async def snapshot_action(
        self,
        request: AnyRequest,
        project_id: FromPath[str],
        snapshot_id: FromPath[str],
        action: FromPath[str],
    ) -> Redirect:
        me = signed_in(request)
        fields = await form(request)
        where = {"account_id": me.account_id, "project_id": project_id, "snapshot_id": snapshot_id}
        if action not in ("rename", "expiry", "delete", "restore", "finalize"):
            raise NotFound("not found")
        async with me.console.store.write() as tx:
            found = await snapshots.find(tx, **where)
            path = f"{_project_path(project_id)}/snapshots?branch={found.source_branch_id}"
            if action == "rename":
                changes = snapshots.SnapshotChanges(name=fields.get("name", ""))
                await snapshots.update(tx, changes=changes, **where)
            elif action == "expiry":  # "never" clears it, as the API's null does
                keep = snapshots.SnapshotChanges(
                    expires_at=expires_at(fields.get("expires_in", ""))
                )
                await snapshots.update(tx, changes=keep, **where)
            elif action == "delete":
                await snapshots.delete(tx, **where)
            else:
                spec = snapshots.RestoreSpec(
                    name=fields.get("name") or None,
                    target_branch_id=fields.get("target_branch_id") or None,
                    finalize_restore=action == "finalize",
                )
                restored, _ = await snapshots.restore(
                    tx, spec=spec, settings=me.console.settings, **where
                )
                # The branch it made (in the target's place, finalized), on the project's page.
                path = f"{_project_path(project_id)}?branch={restored.id}"
        me.console.notify()
        return Redirect(path=path, status_code=303)


def _to_snapshots(me: SignedIn, project_id: str, branch_id: str) -> Redirect:
    me.console.notify()
    return Redirect(
        path=f"{_project_path(project_id)}/snapshots?branch={branch_id}", status_code=303
    )


async def _context(me: SignedIn, project_id: str, branch_id: str) -> dict[str, Any]:
    scope = {"account_id": me.account_id, "project_id": project_id}
    async with me.console.store.read() as tx:
        project = await projects.get(tx, **scope)
        listed = await branches.list_(
            tx, **scope, limit=None, cursor=None, sort_by=None, sort_order=None, search=None
        )
        found = await snapshots.list_(tx, **scope)
        selected = next((b for b in listed.branches if b.id == branch_id), None)
        if selected is None:
            selected = next(b for b in listed.branches if b.default)
        schedule = await backups.get(tx, **scope, branch_id=selected.id)
        recent = await operations.list_(tx, **scope, limit=RECENT_OPERATIONS, cursor=None)
    names = {b.id: b.name for b in listed.branches}
    by_frequency = {str(e["frequency"]): e for e in reversed(schedule)}  # the first of each
    return {
        "project": project,
        "branches": listed.branches,
        "branch_names": names,
        "selected": selected,
        "snapshots": sorted(found, key=lambda s: s.created_at, reverse=True),
        "sizes": {s.id: size(s.full_size) for s in found},
        "schedule": schedule_text(schedule),
        "planned": by_frequency,
        "weekdays": WEEKDAYS,
        "expiry_choices": EXPIRY_CHOICES,
        "max_retention_days": MAX_RETENTION_DAYS,
        "operations": recent.operations,
        "live": unsettled(recent.operations) or any(s.state == "creating" for s in found),
    }
