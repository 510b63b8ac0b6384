-- The WAL a branch's computes wrote, per hour (Neon's written_data_bytes per timeframe, in the
-- consumption history): each sample's growth of the branch's WAL position, in the sample's hour.

ALTER TABLE usage_hours ADD COLUMN written_bytes INTEGER NOT NULL DEFAULT 0;
