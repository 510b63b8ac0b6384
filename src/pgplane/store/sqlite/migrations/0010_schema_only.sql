-- Schema-only branches (Neon's init_source): a branch made from its source's schema and roles
-- alone, a root of its own history. parent-data is every other branch (a copy of its parent).

ALTER TABLE branches ADD COLUMN init_source TEXT NOT NULL DEFAULT 'parent-data';
