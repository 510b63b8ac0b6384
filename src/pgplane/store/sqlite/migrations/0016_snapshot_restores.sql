-- A branch made by a snapshot's restore (Neon's restored_from, restore_status, restored_as): the
-- snapshot it holds, whether its restore waits to be finalized ('restored') or was
-- ('finalized'), and the branch it replaces once finalized.

ALTER TABLE branches ADD COLUMN restored_from TEXT;
ALTER TABLE branches ADD COLUMN restore_status TEXT;
ALTER TABLE branches ADD COLUMN restored_as TEXT;
