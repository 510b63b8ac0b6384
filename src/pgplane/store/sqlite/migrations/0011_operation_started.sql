-- When an operation's first attempt started (microseconds; NULL: never started). Its
-- total_duration_ms runs from there to its end, the pauses between retries included: the sum of
-- its attempts alone said 149 ms for 15 s of retries. Operations started before this column
-- existed keep the sum they had (the engine takes the larger of the two).
ALTER TABLE operations ADD COLUMN started_at INTEGER;
