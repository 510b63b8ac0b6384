-- With an object store: each branch's archive as last sampled (when its newest shipped WAL was
-- written, the bytes its history's objects take in the bucket, and its WAL waiting to be
-- shipped: bytes, and since when), the objects' bytes over time per hour (the
-- consumption's archive_storage_bytes_month), and the platform's checks that what the bucket
-- holds of it restores (objectstore/verify.py: by `pgplane backups verify` or the weekly run).

ALTER TABLE branch_storage ADD COLUMN archived_at INTEGER;
ALTER TABLE branch_storage ADD COLUMN archived_bytes INTEGER;
ALTER TABLE branch_storage ADD COLUMN unarchived_bytes INTEGER;
ALTER TABLE branch_storage ADD COLUMN unarchived_since INTEGER;
ALTER TABLE usage_hours ADD COLUMN archived_byte_s INTEGER NOT NULL DEFAULT 0;

CREATE TABLE backup_checks (
    branch_id      TEXT PRIMARY KEY REFERENCES branches(id),
    project_id     TEXT NOT NULL REFERENCES projects(id),
    checked_at     INTEGER NOT NULL,
    restorable_to  INTEGER,
    error          TEXT
);
CREATE INDEX backup_checks_project ON backup_checks (project_id);
