-- per-shard: expanded once per order shard, {shard} = 0 … order_shards-1.
-- An order's items are clustered under their order: the key is (order_no, line), line
-- numbering the order's units from 0 (rows from before keep their old id as their line,
-- unique all the same). Every read of items is by order number; the surrogate key and
-- the index on order_no cost each item a second B-tree insert for nothing.
ALTER TABLE `order_item_{shard}`
  CHANGE COLUMN IF EXISTS id line BIGINT UNSIGNED NOT NULL,
  DROP PRIMARY KEY,
  ADD PRIMARY KEY (order_no, line),
  DROP INDEX IF EXISTS idx_item_order;
-- The reconciler sums an event's units per category and status on every pass: with the
-- quantity in the index the sum reads the index alone, not every order's row.
ALTER TABLE `order_{shard}`
  DROP INDEX IF EXISTS idx_order_event_status,
  ADD KEY idx_order_event_status (event_id, category_id, status, quantity);
