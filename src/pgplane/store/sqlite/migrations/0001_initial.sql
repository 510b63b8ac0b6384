-- Accounts, API keys, projects and the objects a project holds, and operations.
-- Timestamps are integer microseconds since the Unix epoch (UTC).

CREATE TABLE accounts (
    id          TEXT PRIMARY KEY,
    email       TEXT NOT NULL UNIQUE,
    name        TEXT NOT NULL,
    created_at  INTEGER NOT NULL
);

CREATE TABLE api_keys (
    id                   INTEGER PRIMARY KEY AUTOINCREMENT,
    account_id           TEXT NOT NULL REFERENCES accounts(id),
    name                 TEXT NOT NULL,
    digest               TEXT NOT NULL UNIQUE,
    created_at           INTEGER NOT NULL,
    created_by           TEXT NOT NULL,
    last_used_at         INTEGER,
    last_used_from_addr  TEXT NOT NULL DEFAULT '',
    revoked_at           INTEGER
);
CREATE INDEX api_keys_by_account ON api_keys (account_id, id);

CREATE TABLE projects (
    id                          TEXT PRIMARY KEY,
    account_id                  TEXT NOT NULL REFERENCES accounts(id),
    name                        TEXT NOT NULL,
    region_id                   TEXT NOT NULL,
    pg_version                  INTEGER NOT NULL,
    provisioner                 TEXT NOT NULL,
    store_passwords             INTEGER NOT NULL,
    history_retention_seconds   INTEGER NOT NULL,
    default_endpoint_settings   TEXT NOT NULL,
    settings                    TEXT NOT NULL,
    created_at                  INTEGER NOT NULL,
    updated_at                  INTEGER NOT NULL,
    deleted_at                  INTEGER
);
CREATE INDEX projects_by_account ON projects (account_id, created_at, id);

CREATE TABLE branches (
    id                TEXT PRIMARY KEY,
    project_id        TEXT NOT NULL REFERENCES projects(id),
    parent_id         TEXT REFERENCES branches(id),
    name              TEXT NOT NULL,
    is_default        INTEGER NOT NULL,
    protected         INTEGER NOT NULL,
    current_state     TEXT NOT NULL,
    pending_state     TEXT,
    state_changed_at  INTEGER NOT NULL,
    created_at        INTEGER NOT NULL,
    updated_at        INTEGER NOT NULL,
    deleted_at        INTEGER
);
CREATE INDEX branches_by_project ON branches (project_id, created_at);
CREATE UNIQUE INDEX branches_unique_name ON branches (project_id, name) WHERE deleted_at IS NULL;

CREATE TABLE endpoints (
    id                        TEXT PRIMARY KEY,
    project_id                TEXT NOT NULL REFERENCES projects(id),
    branch_id                 TEXT NOT NULL REFERENCES branches(id),
    type                      TEXT NOT NULL,
    current_state             TEXT NOT NULL,
    pending_state             TEXT,
    port                      INTEGER NOT NULL,
    autoscaling_limit_min_cu  REAL NOT NULL,
    autoscaling_limit_max_cu  REAL NOT NULL,
    suspend_timeout_seconds   INTEGER NOT NULL,
    settings                  TEXT NOT NULL,
    disabled                  INTEGER NOT NULL,
    created_at                INTEGER NOT NULL,
    updated_at                INTEGER NOT NULL,
    last_active               INTEGER,
    started_at                INTEGER,
    suspended_at              INTEGER,
    deleted_at                INTEGER
);
CREATE INDEX endpoints_by_project ON endpoints (project_id, created_at);
CREATE UNIQUE INDEX endpoints_unique_port ON endpoints (port) WHERE deleted_at IS NULL;
CREATE UNIQUE INDEX endpoints_one_read_write ON endpoints (branch_id)
    WHERE type = 'read_write' AND deleted_at IS NULL;

CREATE TABLE roles (
    branch_id   TEXT NOT NULL REFERENCES branches(id),
    name        TEXT NOT NULL,
    password    TEXT NOT NULL,
    protected   INTEGER NOT NULL,
    created_at  INTEGER NOT NULL,
    updated_at  INTEGER NOT NULL,
    PRIMARY KEY (branch_id, name)
);

CREATE TABLE databases (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    branch_id   TEXT NOT NULL REFERENCES branches(id),
    name        TEXT NOT NULL,
    owner_name  TEXT NOT NULL,
    created_at  INTEGER NOT NULL,
    updated_at  INTEGER NOT NULL,
    UNIQUE (branch_id, name)
);

CREATE TABLE operations (
    id                  TEXT PRIMARY KEY,
    project_id          TEXT NOT NULL REFERENCES projects(id),
    branch_id           TEXT,
    endpoint_id         TEXT,
    action              TEXT NOT NULL,
    status              TEXT NOT NULL,
    failures_count      INTEGER NOT NULL,
    error               TEXT,
    retry_at            INTEGER,
    created_at          INTEGER NOT NULL,
    updated_at          INTEGER NOT NULL,
    total_duration_ms   INTEGER NOT NULL,
    lease_owner         TEXT,
    lease_expires_at    INTEGER,
    attempt_started_at  INTEGER
);
-- The page order and the cursor: unique, so a timestamp cursor is exact.
CREATE UNIQUE INDEX operations_page ON operations (project_id, created_at);
CREATE INDEX operations_unsettled ON operations (project_id, created_at)
    WHERE status IN ('scheduling', 'running');
