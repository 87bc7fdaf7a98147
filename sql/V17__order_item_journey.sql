-- per-shard: expanded once per order shard, {shard} = 0 … order_shards-1.
-- A train ticket's journey (docs/trains.md): from and to station, 0-based along the
-- route; NULL for every other ticket.
ALTER TABLE `order_item_{shard}` ADD COLUMN IF NOT EXISTS from_station TINYINT UNSIGNED NULL;
ALTER TABLE `order_item_{shard}` ADD COLUMN IF NOT EXISTS to_station TINYINT UNSIGNED NULL;
