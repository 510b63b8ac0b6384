-- Expiring branches and annotations: a branch may carry the time it is deleted at (expires_at,
-- microseconds, whole seconds as Neon keeps it) and the interval it was set for
-- (ttl_interval_seconds, Neon's read-only field, which a reset starts again from); the scheduler
-- finds the due ones through the partial index. An annotation is a branch's map of strings
-- (Neon's annotation_value), kept beside it, one per branch.

ALTER TABLE branches ADD COLUMN expires_at INTEGER;
ALTER TABLE branches ADD COLUMN ttl_interval_seconds INTEGER;
CREATE INDEX branches_expiring ON branches (expires_at)
    WHERE deleted_at IS NULL AND expires_at IS NOT NULL;

CREATE TABLE branch_annotations (
    branch_id   TEXT PRIMARY KEY REFERENCES branches(id),
    value       TEXT NOT NULL,
    created_at  INTEGER NOT NULL,
    updated_at  INTEGER NOT NULL
);
