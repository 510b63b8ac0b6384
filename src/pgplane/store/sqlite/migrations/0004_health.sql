-- The readiness probe's heartbeat: GET /readyz commits a write here, so "ready" means the store
-- takes writes now (a full disk or an I/O error fails this as it fails every other write).

CREATE TABLE health (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    checked_at INTEGER NOT NULL
);
