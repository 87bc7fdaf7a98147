-- unlist_sale.lua: takes a retired event out of the sales index, only if its entry is
-- still the one the retiring pass saw (an admin's close or reopen since rewrote it: the
-- next pass decides again).
--
-- KEYS[1] sales   hash  event id → "<status>:<sale_start_ms>:<sale_end_ms>"
-- ARGV[1] event id      ARGV[2] the entry seen
--
-- Returns (mirrored by Unlisted in core/src/reconcile/retire.rs):
--    1 GONE     the entry was removed
--    0 CHANGED  the entry is another, or not there: left as it is
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then return 0 end
redis.call('HDEL', KEYS[1], ARGV[1])
return 1
