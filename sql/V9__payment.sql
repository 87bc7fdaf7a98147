-- Payment callbacks, deduplicated on the provider's transaction id. status: APPLIED
-- (order marked PAID) or REFUND_PENDING (arrived after the order was cancelled).
CREATE TABLE IF NOT EXISTS payment (
  provider_txn_id VARCHAR(128)    NOT NULL,
  order_no        BIGINT UNSIGNED NOT NULL,
  amount_cents    BIGINT UNSIGNED NOT NULL,
  status          VARCHAR(16)     NOT NULL,
  received_at     DATETIME(3)     NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
  PRIMARY KEY (provider_txn_id),
  KEY idx_payment_order (order_no)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;
