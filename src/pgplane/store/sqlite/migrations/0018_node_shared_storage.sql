-- The shared storage a node keeps what moves on (the cold archive, its branches' history): the
-- id that storage holds, NULL for a node with none. Projects move between nodes that show the
-- same id (services/moves.py).

ALTER TABLE nodes ADD COLUMN shared_storage TEXT;
