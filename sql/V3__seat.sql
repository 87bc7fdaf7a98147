-- One row per seat of a seated category. status: FREE, LOCKED (held by an unpaid
-- order), SOLD; order_no is set while LOCKED or SOLD.
CREATE TABLE IF NOT EXISTS seat (
  category_id BIGINT UNSIGNED  NOT NULL,
  row_no      SMALLINT UNSIGNED NOT NULL,
  col_no      SMALLINT UNSIGNED NOT NULL,
  event_id    BIGINT UNSIGNED  NOT NULL,
  status      VARCHAR(8)       NOT NULL DEFAULT 'FREE',
  order_no    BIGINT UNSIGNED  NULL,
  PRIMARY KEY (category_id, row_no, col_no),
  KEY idx_seat_event (event_id),
  KEY idx_seat_order (order_no)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;
