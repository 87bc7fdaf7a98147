-- per-shard: expanded once per order shard, {shard} = 0 … order_shards-1.
-- An order's request_id is its order number (the admission's request id), which the
-- primary key already keeps unique, and nothing looks orders up by it: its unique
-- index cost every order one more B-tree insert and a read to check it, for nothing.
ALTER TABLE `order_{shard}` DROP INDEX IF EXISTS uk_order_request;
