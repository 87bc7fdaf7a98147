-- move_out.lua: the first step of moving units of one category between an event's pool
-- and one of its buckets (docs/scaling.md "Refill without oversell"): takes units out
-- of one place and records the move there, in one script in that place's slot. The
-- core then credits them where they go (move_in.lua) and deletes the record; a move
-- whose record outlives a few seconds is replayed by the sweeper (crediting is done
-- once per move id), so units taken out are never lost and never counted twice.
--
-- KEYS[1] stock    hash  category id → units (the pool's or the bucket's)
-- KEYS[2] moves    hash  move id → "<to>|<category>|<units>|<ms>" (this place's moves)
-- KEYS[3] soldout  hash  the edge's sold-out flags (the event's; only read and written
--                        when taking from the pool)
-- ARGV[1] category id   ARGV[2] move id   ARGV[3] destination ("pool" or bucket index)
-- ARGV[4] now, ms       ARGV[5] at least this many units (if there are)
-- ARGV[6] share: take at least ceil(units here / share); 1 takes everything
-- ARGV[7] "pool" when taking from the pool, else "bucket"
--
-- Returns (mirrored by MovedOut in core/src/buckets.rs): the units taken (0: none
-- here); when taking from the pool, -1 if the category is flagged sold out, and -2 if
-- the pool was empty (the flag is not set here: only after a drain found every bucket
-- empty too, by set_sold_out.lua).
local rcall = redis.call
local cid, id = ARGV[1], ARGV[2]
local recorded = rcall('HGET', KEYS[2], id)
if recorded then
  -- A retried call: the first run took these units already.
  return tonumber(string.match(recorded, '^[^|]*|[^|]*|(%d+)|'))
end
local from_pool = ARGV[7] == 'pool'
if from_pool and rcall('HEXISTS', KEYS[3], cid) == 1 then return -1 end
local have = tonumber(rcall('HGET', KEYS[1], cid) or '0')
if have <= 0 then
  if from_pool then return -2 end
  return 0
end
local n = math.max(tonumber(ARGV[5]), math.ceil(have / tonumber(ARGV[6])))
if n > have then n = have end
rcall('HINCRBY', KEYS[1], cid, -n)
rcall('HSET', KEYS[2], id, ARGV[3] .. '|' .. cid .. '|' .. n .. '|' .. ARGV[4])
return n
