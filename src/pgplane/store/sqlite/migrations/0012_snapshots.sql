-- Snapshots (Neon's snapshot API): a branch's data at a point, kept apart from the branch's
-- history so that it outlives the history window it was taken in. The row is the desired state;
-- create_snapshot builds its data (state creating -> ready, or failed), delete_snapshot frees it.
-- roles and databases: the branch's, as the store had them when it was taken (JSON), given to a
-- branch restored from it. schedule_slot: the backup schedule's slot a scheduled snapshot was
-- taken for; unique per branch, so a slot is never taken twice, whatever restarts.

CREATE TABLE snapshots (
    id                TEXT PRIMARY KEY,
    project_id        TEXT NOT NULL REFERENCES projects(id),
    source_branch_id  TEXT NOT NULL,
    name              TEXT NOT NULL,
    state             TEXT NOT NULL,
    lsn               TEXT,
    point_time        INTEGER,
    manual            INTEGER NOT NULL,
    full_size         INTEGER,
    roles             TEXT NOT NULL,
    databases         TEXT NOT NULL,
    schedule_slot     TEXT,
    created_at        INTEGER NOT NULL,
    updated_at        INTEGER NOT NULL,
    expires_at        INTEGER,
    deleted_at        INTEGER
);
CREATE INDEX snapshots_of_project ON snapshots (project_id, created_at);
CREATE INDEX snapshots_expiring ON snapshots (expires_at)
    WHERE deleted_at IS NULL AND expires_at IS NOT NULL;
CREATE UNIQUE INDEX snapshots_slot ON snapshots (source_branch_id, schedule_slot)
    WHERE schedule_slot IS NOT NULL;

-- The snapshot an operation builds, frees or restores from.
ALTER TABLE operations ADD COLUMN snapshot_id TEXT;

-- A branch's backup schedule (Neon's BackupSchedule: a list of {frequency, hour, day, month,
-- retention_seconds}), as JSON, and when it was set: slots before that are never taken.
CREATE TABLE backup_schedules (
    branch_id   TEXT PRIMARY KEY REFERENCES branches(id),
    project_id  TEXT NOT NULL REFERENCES projects(id),
    schedule    TEXT NOT NULL,
    updated_at  INTEGER NOT NULL
);
