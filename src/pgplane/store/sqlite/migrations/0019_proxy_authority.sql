-- The tenant-facing certificate authority of a platform of several nodes (src/pgplane/tls/shared.py):
-- the one clients trust to verify the proxy, the same for every node, so a client that trusts it
-- verifies whichever node a load balancer hands it to. Apart from the node authority (0017),
-- whose certificates open the node door: a certificate of this one never does. One per platform
-- (id 1), made or brought from the first node's data directory by the first node that needs it,
-- in the transaction that finds none; replaced only by a node that no other node up serves it
-- beside. A SQLite store (one node) leaves it empty: its node keeps its authority in its data
-- directory. Its key is as secret as the node authority's.

CREATE TABLE proxy_authority (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    cert TEXT NOT NULL,
    key TEXT NOT NULL,
    created_at INTEGER NOT NULL
);
