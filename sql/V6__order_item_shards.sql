-- per-shard: expanded once per order shard, {shard} = 0 … order_shards-1.
-- One unit of an order: a seat (row_no, col_no) or an unseated ticket (NULLs).
CREATE TABLE IF NOT EXISTS `order_item_{shard}` (
  id          BIGINT UNSIGNED   NOT NULL AUTO_INCREMENT,
  order_no    BIGINT UNSIGNED   NOT NULL,
  category_id BIGINT UNSIGNED   NOT NULL,
  row_no      SMALLINT UNSIGNED NULL,
  col_no      SMALLINT UNSIGNED NULL,
  price_cents BIGINT UNSIGNED   NOT NULL,
  PRIMARY KEY (id),
  KEY idx_item_order (order_no)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;
