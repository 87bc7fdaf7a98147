-- unlist_sale.lua: takes a retired event out of the sales index, only if its entry is
-- still the one the retiring pass saw (an admin's close or reopen since rewrote it: the
-- next pass decides again) and its sale is over by this node's clock (a sale closed
-- early: retire_bucket.lua judged that on its metadata, which has the close's time).
--
-- KEYS[1] sales   hash  event id → "<status>:<sale_start_ms>:<sale_end_ms>"
-- ARGV[1] event id      ARGV[2] the entry seen
-- ARGV[3] ms after sale_end_ms before the sale counts as over
--
-- Returns (mirrored by Unlisted in core/src/reconcile/retire.rs):
--    1 GONE      the entry was removed
--    0 CHANGED   the entry is another, or not there: left as it is
--   -1 NOT_OVER  by this node's clock the sale is not over for long enough
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then return 0 end
if string.sub(ARGV[2], 1, 7) == 'closed:' then
  redis.call('HDEL', KEYS[1], ARGV[1])
  return 1
end
local sale_end = tonumber(string.match(ARGV[2], ':(%d+)$'))
local t = redis.call('TIME')
if not sale_end
  or tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) < sale_end + tonumber(ARGV[3]) then
  return -1
end
redis.call('HDEL', KEYS[1], ARGV[1])
return 1
