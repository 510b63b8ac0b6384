-- Scale to zero: where a project's data lives, and what the scheduler looks up every tick.
--
-- storage_state is 'attached' (hot data under the data directory) or 'detached' (in the cold
-- archive, after tenant_detach). endpoints.last_active is written by the proxy's activity flush.

ALTER TABLE projects ADD COLUMN storage_state TEXT NOT NULL DEFAULT 'attached';

CREATE INDEX endpoints_live ON endpoints (current_state) WHERE deleted_at IS NULL;
CREATE INDEX operations_by_action ON operations (action, branch_id, created_at);
