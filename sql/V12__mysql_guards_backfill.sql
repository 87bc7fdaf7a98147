-- per-shard: expanded once per order shard, {shard} = 0 … order_shards-1.
-- The guards' counters for orders made before they existed.
UPDATE ticket_category c SET c.committed = c.committed + (
  SELECT COALESCE(SUM(o.quantity), 0) FROM `order_{shard}` o
  WHERE o.category_id = c.id AND o.status IN ('UNPAID', 'PAID'));
INSERT INTO user_hold (event_id, user_id, units)
  SELECT event_id, user_id, SUM(quantity) FROM `order_{shard}`
  WHERE status IN ('UNPAID', 'PAID') GROUP BY event_id, user_id
  ON DUPLICATE KEY UPDATE units = units + VALUES(units);
-- Only the statuses the core knows (core/src/order_tables.rs, OrderStatus).
ALTER TABLE `order_{shard}` ADD CONSTRAINT IF NOT EXISTS `ck_order_status_{shard}`
  CHECK (status IN ('UNPAID', 'PAID', 'CANCELLED', 'REFUND_PENDING'));
