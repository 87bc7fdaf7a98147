-- How many Redis buckets (hash tags) an event's unseated stock is split over, so that
-- one hot event's admissions spread over several Redis Cluster shards
-- (docs/scaling.md). 1 is the layout of every event before: all its keys in one slot.
-- Set when the event is created; never changed after.
ALTER TABLE event ADD COLUMN IF NOT EXISTS buckets TINYINT UNSIGNED NOT NULL DEFAULT 1;
