-- Stock sync's record per batch and ticket category, where it was one flag per order
-- (stock_log.synced): order creation writes one row per category of the reservations it
-- judged (the units its orders took; 0, and synced, when the guards refused them all, so
-- the transaction check-back still finds the batch), stock sync subtracts `units` from
-- remain and marks the row, a cancellation before that lowers `units` instead (and marks
-- the row synced when it takes out the last order). An order no longer
-- writes an entry into an index of unsynced rows nor has its row updated by stock sync:
-- the work per batch is one row per category, whatever the batch's size.
--
-- units:  while unsynced, what stock sync is to subtract from remain for this batch and
--         category; once synced, nothing reads it (the batches copied below keep their
--         live orders' units).
-- orders: the orders behind `units` (the stats' count of orders not yet synced).
CREATE TABLE IF NOT EXISTS stock_batch (
  batch_id    VARCHAR(64)     NOT NULL,
  category_id BIGINT UNSIGNED NOT NULL,
  event_id    BIGINT UNSIGNED NOT NULL,
  units       INT UNSIGNED    NOT NULL,
  orders      INT UNSIGNED    NOT NULL,
  synced      TINYINT(1)      NOT NULL DEFAULT 0,
  created_at  DATETIME(3)     NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
  synced_at   DATETIME(3)     NULL,
  PRIMARY KEY (batch_id, category_id),
  KEY idx_stock_batch_unsynced (synced, event_id, created_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;
-- The batches from before, from their stock_log rows (an expiry's rows name no batch).
-- A batch's live rows were synced all together or not at all; a row cancelled before
-- its batch synced was marked synced with nothing subtracted, so it is left out of an
-- unsynced batch's units. INSERT IGNORE: a run cut short can be run again (before
-- V23, which drops the flag this reads).
INSERT IGNORE INTO stock_batch (batch_id, category_id, event_id, units, orders, synced, created_at, synced_at)
SELECT batch_id, category_id, MIN(event_id),
       SUM(IF(status = 'COMMITTED', quantity, 0)), SUM(status = 'COMMITTED'),
       MIN(IF(status = 'COMMITTED', synced, 1)), MIN(created_at),
       IF(MIN(IF(status = 'COMMITTED', synced, 1)) = 1, MAX(synced_at), NULL)
FROM stock_log WHERE status <> 'EXPIRED' GROUP BY batch_id, category_id;
