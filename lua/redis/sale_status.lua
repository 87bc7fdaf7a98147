-- sale_status.lua: writes a close's or a reopen's status into one metadata hash, only if
-- the hash is there: a plain HSET on keys a purge or a loss removed would make a hash of
-- one field, which reads as loaded (the stock being kept) and admits with no limits or
-- statuses. Without the hash the event stays not loaded, and a reopen rebuilds it.
-- A close also notes when, by this node's clock (closed_ms, the first close's): a sale
-- closed early is retired that long after (retire_bucket.lua); a reopen forgets it.
--
-- With it the event's bucket count (ARGV[2]), which the edge reads from the event's meta
-- to find the buckets' records (lua/edge/stampede/admitted.lua): an event loaded before
-- the meta had it gets it at its close.
--
-- KEYS[1] meta    ARGV[1] "open" or "closed"    ARGV[2] the event's bucket count
--
-- Returns (mirrored by StatusWritten in core/src/preload/mod.rs):
--    1 WRITTEN     the status is written
--    0 NOT_LOADED  no metadata: nothing written
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], 'status', ARGV[1])
if ARGV[2] then redis.call('HSET', KEYS[1], 'buckets', ARGV[2]) end
if ARGV[1] == 'closed' then
  local t = redis.call('TIME')
  redis.call('HSETNX', KEYS[1], 'closed_ms',
    string.format('%d', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)))
else
  redis.call('HDEL', KEYS[1], 'closed_ms')
end
return 1
