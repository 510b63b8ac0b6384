-- Compute usage (core/usage.py): per endpoint, its totals over all its runs and where its last
-- run seen stood, kept after the endpoint is deleted (a project's figures include its deleted
-- computes, as Neon's do); and per branch and hour, what its computes used then, for the
-- consumption history. Times in microseconds, hours as their start in epoch seconds.

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
    PRIMARY KEY (project_id, hour, branch_id)
);
