-- Anonymized branches (Neon's branch_anonymized): the branch is marked (its computes serve only
-- once its masking ran), and its masking rules and their last run are kept beside it.

ALTER TABLE branches ADD COLUMN anonymized INTEGER NOT NULL DEFAULT 0;

CREATE TABLE branch_masking (
    branch_id       TEXT PRIMARY KEY REFERENCES branches(id),
    project_id      TEXT NOT NULL REFERENCES projects(id),
    masking_rules   TEXT NOT NULL,
    state           TEXT NOT NULL,
    status_message  TEXT,
    masked_columns  INTEGER,
    created_at      INTEGER NOT NULL,
    updated_at      INTEGER NOT NULL,
    started_at      INTEGER,
    completed_at    INTEGER,
    failed_at       INTEGER
);
CREATE INDEX branch_masking_project ON branch_masking (project_id);
