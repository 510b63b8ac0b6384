-- A snapshot's slug (Neon's: a resource id its user chooses, unique among the project's live
-- snapshots; the snapshot's id when none is given). Snapshots taken before have none.

ALTER TABLE snapshots ADD COLUMN slug TEXT;
CREATE UNIQUE INDEX snapshots_slug ON snapshots (project_id, slug)
    WHERE deleted_at IS NULL AND slug IS NOT NULL;
