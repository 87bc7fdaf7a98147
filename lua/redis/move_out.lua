-- move_out.lua: the first step of moving units of one category between an event's pool
-- and one of its buckets (docs/scaling.md "Refill without oversell"): takes units out
-- of one place and records the move there, in one script in that place's slot. The
-- core then credits them where they go (move_in.lua) and deletes the record; a move
-- whose record outlives a few seconds is finished by the sweeper (crediting is done
-- once per move id), so units taken out are never lost and never counted twice. The
-- record carries the generation of the keys (`epoch`) the units were taken from: a
-- rebuild from MySQL in between makes them stale, and move_in.lua refuses them.
--
-- KEYS[1] stock    hash  category id → units (the pool's or the bucket's)
-- KEYS[2] moves    hash  move id → "<to>|<category>|<units>|<ms>|<epoch>" (this place's)
-- KEYS[3] soldout  hash  the edge's sold-out flags (the event's; only read when taking
--                        from the pool)
-- KEYS[4] meta     hash  this place's metadata: the event's for the pool, else the
--                        bucket's (its `epoch`; absent while the event is fenced)
-- ARGV[1] category id   ARGV[2] move id   ARGV[3] destination ("pool" or bucket index)
-- ARGV[4] now, ms (the caller's clock)   ARGV[5] at least this many units (if there are)
-- ARGV[6] share: take at least ceil(units here / share); 1 takes everything
-- ARGV[7] "pool" when taking from the pool, else "bucket"
-- ARGV[8] how old (ms, by Redis's clock) a call may be: an older one is a retry the
--         sweeper may have finished already, and takes nothing
--
-- Returns {units taken, epoch} (mirrored by MovedOut in core/src/buckets.rs): units 0
-- when none here; when taking from the pool, -1 if the category is flagged sold out
-- and -2 if the pool is empty (the flag is set only by set_sold_out.lua, after a drain
-- found every bucket empty too); -3 when this place is not loaded (fenced, or being
-- rebuilt from MySQL) or the call is too old.
local rcall = redis.call
local cid, id = ARGV[1], ARGV[2]
local recorded = rcall('HGET', KEYS[2], id)
if recorded then
  -- A retried call: the first run took these units already.
  local units, epoch = string.match(recorded, '^[^|]*|[^|]*|(%d+)|%d+|(%d+)$')
  return {tonumber(units), tonumber(epoch)}
end
local t = rcall('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local epoch = rcall('HGET', KEYS[4], 'epoch')
if not epoch or now - tonumber(ARGV[4]) > tonumber(ARGV[8]) then return {-3, 0} end
local from_pool = ARGV[7] == 'pool'
if from_pool and rcall('HEXISTS', KEYS[3], cid) == 1 then return {-1, 0} end
local have = tonumber(rcall('HGET', KEYS[1], cid) or '0')
if have <= 0 then
  if from_pool then return {-2, 0} end
  return {0, 0}
end
local n = math.max(tonumber(ARGV[5]), math.ceil(have / tonumber(ARGV[6])))
if n > have then n = have end
rcall('HINCRBY', KEYS[1], cid, -n)
rcall('HSET', KEYS[2], id, ARGV[3] .. '|' .. cid .. '|' .. n .. '|' .. ARGV[4] .. '|' .. epoch)
return {n, tonumber(epoch)}
