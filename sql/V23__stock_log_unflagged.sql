-- stock_batch (V22) says what is synced: stock_log's per-order flag, its time and the
-- index of unsynced rows go. One ALTER, all or nothing, and it can be run again.
ALTER TABLE stock_log
  DROP INDEX IF EXISTS idx_stock_log_unsynced,
  DROP COLUMN IF EXISTS synced,
  DROP COLUMN IF EXISTS synced_at;
