-- Which node certificates open a node's door: the SHA-256 fingerprints (hex, space-separated,
-- newest first) of the certificates the node holding the name issued itself. The door admits a
-- certificate of the node authority only if it is one of these, on a node that is up, so a
-- certificate minted with the authority's key (which this store keeps) opens nothing, and a
-- node removed, or whose name another process took, loses its door at once.

ALTER TABLE nodes ADD COLUMN door_certs TEXT NOT NULL DEFAULT '';
