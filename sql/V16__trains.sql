-- Trains (docs/trains.md): an event of kind 'train' has ordered stations; its
-- categories are seat classes (seat_rows = carriages, seat_cols = seats per carriage,
-- total = seats × segments: the stock books count seat-segments), and no `seat` rows.
ALTER TABLE event ADD COLUMN IF NOT EXISTS kind VARCHAR(8) NOT NULL DEFAULT 'sale';
CREATE TABLE IF NOT EXISTS event_station (
  event_id BIGINT UNSIGNED  NOT NULL,
  idx      TINYINT UNSIGNED NOT NULL,
  name     VARCHAR(100)     NOT NULL,
  PRIMARY KEY (event_id, idx)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
-- MySQL's seat guard for trains: one row per seat and segment a live order holds
-- (segment i runs from station i to station i + 1). The primary key refuses a seat sold
-- twice on one segment; cancelling an order deletes its rows.
CREATE TABLE IF NOT EXISTS seat_segment (
  category_id BIGINT UNSIGNED   NOT NULL,
  row_no      SMALLINT UNSIGNED NOT NULL,
  col_no      SMALLINT UNSIGNED NOT NULL,
  segment     TINYINT UNSIGNED  NOT NULL,
  order_no    BIGINT UNSIGNED   NOT NULL,
  event_id    BIGINT UNSIGNED   NOT NULL,
  PRIMARY KEY (category_id, row_no, col_no, segment),
  KEY idx_seat_segment_order (order_no)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;
