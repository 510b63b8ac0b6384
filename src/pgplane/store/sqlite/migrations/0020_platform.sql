-- The platform's own id, made by the first process that needs it (objectstore/claim.py): what an
-- object store's prefix records as its owner, so that every node of one store, and a platform
-- recovered from a copy of its store, is that owner, and any other platform is refused there.
-- One row (id 1).

CREATE TABLE platform (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    platform_id TEXT NOT NULL,
    created_at INTEGER NOT NULL
);
