-- retire_bucket.lua: closes one bucket of a sale that is over to admissions, if nothing
-- is in its stream (README "Reconciliation": a finished sale is retired). From here
-- reserve.lua and seat_lock.lua answer NOT_OPEN whatever clock a core's request
-- carries, so no reservation enters a stream once no worker reads it. Whether the sale
-- is over is this master's clock's say, not the retiring core's: its window ended, or
-- it was closed early (closed_ms, sale_status.lua), ARGV[1] ms ago or more.
--
-- KEYS[1] meta    hash   the bucket's metadata (the event's, for the seats' slot):
--                        sale_end_ms, status, closed_ms
-- KEYS[2] stream  stream the bucket's reservations (the meta key again for the seats'
--                        slot, which has none)
-- ARGV[1] ms after sale_end_ms before the sale counts as over
--
-- Returns (mirrored by Retired in core/src/reconcile/retire.rs):
--    1 CLOSED    closed to admissions (or was already)
--    0 BUSY      reservations are in the stream, or the keys are gone: left as it was
--   -1 NOT_OVER  by this master's clock the sale is not over for long enough
local m = redis.call('HMGET', KEYS[1], 'sale_end_ms', 'status', 'closed_ms')
local over = tonumber(m[1])
if not over then return 0 end
if m[2] == 'closed' and tonumber(m[3]) and tonumber(m[3]) < over then over = tonumber(m[3]) end
local t = redis.call('TIME')
if tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) < over + tonumber(ARGV[1]) then
  return -1
end
if KEYS[2] ~= KEYS[1] and redis.call('XLEN', KEYS[2]) > 0 then return 0 end
redis.call('HSET', KEYS[1], 'status', 'closed')
return 1
