-- set_sold_out.lua: flags a category of an event of several buckets sold out for the
-- edge, after a drain moved every bucket's units of it into the pool: only if the pool
-- is still empty and no move out of the pool is under way (units moving to a bucket
-- are still for sale there).
--
-- KEYS[1] pool     hash  category id → units
-- KEYS[2] moves    hash  the pool's moves under way
-- KEYS[3] soldout  hash  the edge's sold-out flags
-- ARGV[1] category id
--
-- Returns (mirrored by Flagged in core/src/buckets.rs):
--    1 SET   flagged sold out
--    0 LEFT  units are left in the pool or moving out of it: not flagged
local cid = ARGV[1]
if tonumber(redis.call('HGET', KEYS[1], cid) or '0') > 0 then return 0 end
for _, move in ipairs(redis.call('HVALS', KEYS[2])) do
  if string.match(move, '^[^|]*|([^|]*)|') == cid then return 0 end
end
redis.call('HSET', KEYS[3], cid, 1)
return 1
