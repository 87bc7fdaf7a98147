-- adjust_stock.lua: the reconciler's correction of one category's stock, never below 0.
--
-- KEYS[1] stock    hash  category id → units available
-- KEYS[2] soldout  hash  category id → 1 once stock reached 0
-- ARGV[1] category id    ARGV[2] delta (negative lowers)
--
-- Returns (mirrored by Adjusted in core/src/reconcile/heal.rs): the stock after the change.
local rcall = redis.call
local cid = ARGV[1]
local left = rcall('HINCRBY', KEYS[1], cid, tonumber(ARGV[2]))
if left <= 0 then
  if left < 0 then rcall('HSET', KEYS[1], cid, 0) end
  rcall('HSET', KEYS[2], cid, 1)
  return 0
end
rcall('HDEL', KEYS[2], cid)
return left
