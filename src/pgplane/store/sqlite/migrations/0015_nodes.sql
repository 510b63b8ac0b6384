-- Nodes: each `serve` sharing the store registers here, and renews its heartbeat; a project is
-- placed on one node, whose engine alone runs its operations and whose scheduler alone starts
-- its timed work. A project of an earlier store (node NULL) is adopted by the first node that
-- starts (services/nodes.py), so a single-node platform changes nothing.
--
-- state: what an operator set (active, cordoned, draining); "down" is never stored: a node is
-- down when its lease (expires_at, renewed with each heartbeat) has run out.
-- instance: the process holding the name, so a second process given the same name is refused
-- while the first is alive.

CREATE TABLE nodes (
    name TEXT PRIMARY KEY,
    instance TEXT NOT NULL,
    api_url TEXT NOT NULL,
    proxy_address TEXT NOT NULL,
    compute_host TEXT NOT NULL,
    capacity INTEGER NOT NULL,
    state TEXT NOT NULL,
    started_at INTEGER NOT NULL,
    heartbeat_at INTEGER NOT NULL,
    expires_at INTEGER NOT NULL
);

ALTER TABLE projects ADD COLUMN node TEXT;

CREATE INDEX projects_node ON projects (node);
