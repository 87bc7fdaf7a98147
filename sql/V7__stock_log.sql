-- One row per created order, written in the same transaction as the order: the
-- RocketMQ check-back reads it, and it is the outbox for stock sync (synced = 0 until
-- ticket_category.remain has been decremented for it).
CREATE TABLE IF NOT EXISTS stock_log (
  id          BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
  order_no    BIGINT UNSIGNED NOT NULL,
  event_id    BIGINT UNSIGNED NOT NULL,
  category_id BIGINT UNSIGNED NOT NULL,
  quantity    INT UNSIGNED    NOT NULL,
  batch_id    VARCHAR(64)     NOT NULL,
  tx_id       VARCHAR(128)    NULL,
  status      VARCHAR(16)     NOT NULL DEFAULT 'COMMITTED',
  synced      TINYINT(1)      NOT NULL DEFAULT 0,
  created_at  DATETIME(3)     NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
  synced_at   DATETIME(3)     NULL,
  PRIMARY KEY (id),
  UNIQUE KEY uk_stock_log_order (order_no),
  KEY idx_stock_log_batch (batch_id),
  KEY idx_stock_log_unsynced (synced, event_id, created_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;
