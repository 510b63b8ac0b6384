-- The node channel (src/pgplane/nodelink/): where each node's door listens, beside its proxy,
-- and the platform's node authority, which signs the certificates nodes show each other there.
-- One authority per platform (id 1), made by the first node that needs it, in the transaction
-- that finds none. Its key is as secret as the passwords this store keeps already.

ALTER TABLE nodes ADD COLUMN node_address TEXT NOT NULL DEFAULT '';

CREATE TABLE node_authority (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    cert TEXT NOT NULL,
    key TEXT NOT NULL,
    created_at INTEGER NOT NULL
);
