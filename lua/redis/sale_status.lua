-- sale_status.lua: writes a close's or a reopen's status into one metadata hash, only if
-- the hash is there: a plain HSET on keys a purge or a loss removed would make a hash of
-- one field, which reads as loaded (the stock being kept) and admits with no limits or
-- statuses. Without the hash the event stays not loaded, and a reopen rebuilds it.
--
-- KEYS[1] meta    ARGV[1] "open" or "closed"
--
-- Returns (mirrored by StatusWritten in core/src/preload/mod.rs):
--    1 WRITTEN     the status is written
--    0 NOT_LOADED  no metadata: nothing written
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], 'status', ARGV[1])
return 1
