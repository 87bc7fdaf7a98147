-- adjust_stock.lua: the reconciler's correction of one category's stock, never below 0.
--
-- KEYS[1] stock    hash  category id → units available
-- KEYS[2] soldout  hash  category id → 1 once stock reached 0
-- ARGV[1] category id    ARGV[2] delta (negative lowers)
-- ARGV[3] the stock the delta was measured against: applied only if the stock is still
--         that, so a call retried after it ran (a cluster client's retry) or a sale that
--         moved meanwhile changes nothing
--
-- Returns (mirrored by Adjusted in core/src/reconcile/heal.rs): the stock after the
-- change, or -1 when the stock was not ARGV[3] (nothing changed).
local rcall = redis.call
local cid = ARGV[1]
if tonumber(rcall('HGET', KEYS[1], cid) or '0') ~= tonumber(ARGV[3]) then return -1 end
local left = rcall('HINCRBY', KEYS[1], cid, tonumber(ARGV[2]))
if left <= 0 then
  if left < 0 then rcall('HSET', KEYS[1], cid, 0) end
  rcall('HSET', KEYS[2], cid, 1)
  return 0
end
rcall('HDEL', KEYS[2], cid)
return left
