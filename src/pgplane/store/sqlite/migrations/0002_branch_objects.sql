-- Branches, computes, roles and databases as users change them.
--
-- A deleted role or database stays as a tombstone (deleted_at) until the apply_config operation
-- that drops it on the compute finishes; a renamed database keeps the name the compute holds in
-- applied_name until its rename is applied. Names are unique among live rows only.
-- create_branch waits for its parent's earlier operations: operations.source_branch_id.

ALTER TABLE operations ADD COLUMN source_branch_id TEXT;

CREATE TABLE roles_v2 (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    branch_id   TEXT NOT NULL REFERENCES branches(id),
    name        TEXT NOT NULL,
    password    TEXT NOT NULL,
    protected   INTEGER NOT NULL,
    login       INTEGER NOT NULL DEFAULT 1,
    created_at  INTEGER NOT NULL,
    updated_at  INTEGER NOT NULL,
    deleted_at  INTEGER
);
INSERT INTO roles_v2 (branch_id, name, password, protected, created_at, updated_at)
    SELECT branch_id, name, password, protected, created_at, updated_at FROM roles
    ORDER BY created_at, name;
DROP TABLE roles;
ALTER TABLE roles_v2 RENAME TO roles;
CREATE UNIQUE INDEX roles_unique_name ON roles (branch_id, name) WHERE deleted_at IS NULL;
CREATE INDEX roles_by_branch ON roles (branch_id, id);

CREATE TABLE databases_v2 (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    branch_id     TEXT NOT NULL REFERENCES branches(id),
    name          TEXT NOT NULL,
    owner_name    TEXT NOT NULL,
    applied_name  TEXT,
    created_at    INTEGER NOT NULL,
    updated_at    INTEGER NOT NULL,
    deleted_at    INTEGER
);
INSERT INTO databases_v2 (id, branch_id, name, owner_name, applied_name, created_at, updated_at)
    SELECT id, branch_id, name, owner_name, name, created_at, updated_at FROM databases;
DROP TABLE databases;
ALTER TABLE databases_v2 RENAME TO databases;
CREATE UNIQUE INDEX databases_unique_name ON databases (branch_id, name) WHERE deleted_at IS NULL;
CREATE INDEX databases_by_branch ON databases (branch_id, id);

CREATE INDEX branches_by_parent ON branches (parent_id) WHERE deleted_at IS NULL;
CREATE INDEX endpoints_by_branch ON endpoints (branch_id) WHERE deleted_at IS NULL
