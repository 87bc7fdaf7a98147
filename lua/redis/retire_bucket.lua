-- retire_bucket.lua: closes one bucket of a sale that is over to admissions, if nothing
-- is in its stream (README "Reconciliation": a finished sale is retired). From here
-- reserve.lua and seat_lock.lua answer NOT_OPEN whatever clock a core's request
-- carries, so no reservation enters a stream once no worker reads it.
--
-- KEYS[1] meta    hash   the bucket's metadata (the event's, for the seats' slot)
-- KEYS[2] stream  stream the bucket's reservations (the meta key again for the seats'
--                        slot, which has none)
--
-- Returns (mirrored by Retired in core/src/reconcile/retire.rs):
--    1 CLOSED  closed to admissions (or was already)
--    0 BUSY    reservations are in the stream, or the keys are gone: left as it was
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
if KEYS[2] ~= KEYS[1] and redis.call('XLEN', KEYS[2]) > 0 then return 0 end
redis.call('HSET', KEYS[1], 'status', 'closed')
return 1
