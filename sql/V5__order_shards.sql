-- per-shard: expanded once per order shard, {shard} = 0 … order_shards-1.
-- An order. order_no carries the buyer's user-id gene in its low bits, so order_no and
-- user_id pick the same shard. status: UNPAID, PAID, CANCELLED, REFUND_PENDING.
CREATE TABLE IF NOT EXISTS `order_{shard}` (
  order_no      BIGINT UNSIGNED NOT NULL,
  user_id       BIGINT UNSIGNED NOT NULL,
  event_id      BIGINT UNSIGNED NOT NULL,
  category_id   BIGINT UNSIGNED NOT NULL,
  quantity      INT UNSIGNED    NOT NULL,
  amount_cents  BIGINT UNSIGNED NOT NULL,
  status        VARCHAR(16)     NOT NULL DEFAULT 'UNPAID',
  request_id    VARCHAR(64)     NOT NULL,
  pay_deadline  DATETIME(3)     NOT NULL,
  created_at    DATETIME(3)     NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
  paid_at       DATETIME(3)     NULL,
  cancelled_at  DATETIME(3)     NULL,
  PRIMARY KEY (order_no),
  UNIQUE KEY uk_order_request (request_id),
  KEY idx_order_user_event (user_id, event_id),
  KEY idx_order_event_status (event_id, category_id, status),
  KEY idx_order_status_deadline (status, pay_deadline)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;
