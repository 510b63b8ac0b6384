-- Usage (core/usage.py). Per endpoint, its computes' totals over all their runs and where the
-- last run seen stood, kept after the endpoint is deleted (a project's figures include its
-- deleted computes, as Neon's do). Per branch, what it takes (bytes; NULL: never known) as last
-- sampled, the logical size kept while no compute runs; the WAL it wrote (from its position,
-- each advance counted once). Per branch and hour, what its computes
-- used then and its storage integrated over time (byte-seconds), for the consumption history.
-- Times in microseconds, hours as their start in epoch seconds.

CREATE TABLE endpoint_usage (
    endpoint_id     TEXT PRIMARY KEY,
    project_id      TEXT NOT NULL,
    branch_id       TEXT NOT NULL,
    run             TEXT,
    run_started_us  INTEGER NOT NULL DEFAULT 0,
    run_cpu_us      INTEGER NOT NULL DEFAULT 0,
    run_seen_us     INTEGER NOT NULL DEFAULT 0,
    cpu_us          INTEGER NOT NULL DEFAULT 0,
    active_us       INTEGER NOT NULL DEFAULT 0,
    cu_us           INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX endpoint_usage_project ON endpoint_usage (project_id);

CREATE TABLE usage_hours (
    project_id  TEXT NOT NULL,
    branch_id   TEXT NOT NULL,
    hour        INTEGER NOT NULL,
    cpu_us      INTEGER NOT NULL DEFAULT 0,
    active_us   INTEGER NOT NULL DEFAULT 0,
    cu_us       INTEGER NOT NULL DEFAULT 0,
    logical_byte_s  INTEGER NOT NULL DEFAULT 0,
    data_byte_s     INTEGER NOT NULL DEFAULT 0,
    history_byte_s  INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (project_id, hour, branch_id)
);

CREATE TABLE branch_storage (
    branch_id       TEXT PRIMARY KEY,
    project_id      TEXT NOT NULL,
    logical_bytes   INTEGER,
    data_bytes      INTEGER,
    history_bytes   INTEGER,
    wal_lsn         INTEGER,
    written_bytes   INTEGER NOT NULL DEFAULT 0,
    sampled_us      INTEGER NOT NULL
);
CREATE INDEX branch_storage_project ON branch_storage (project_id);
