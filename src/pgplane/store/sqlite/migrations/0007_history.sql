-- History: a branch records where it starts in its parent's history (parent_lsn as Neon shows
-- it, parent_timestamp in microseconds) and when it was last restored or reset; an operation
-- that rebuilds from history carries its point (an LSN, or a time in microseconds) and, for a
-- restore that keeps the old state, the branch that keeps it.

ALTER TABLE branches ADD COLUMN parent_lsn TEXT;
ALTER TABLE branches ADD COLUMN parent_timestamp INTEGER;
ALTER TABLE branches ADD COLUMN last_reset_at INTEGER;

ALTER TABLE operations ADD COLUMN point_lsn TEXT;
ALTER TABLE operations ADD COLUMN point_time INTEGER;
ALTER TABLE operations ADD COLUMN preserve_branch_id TEXT;
