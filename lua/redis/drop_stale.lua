-- drop_stale.lua: drop reservations taken under an older generation of the event's
-- keys (a rebuild from MySQL counted their units as free: they must never become
-- orders, nor be given back), once the rebuild is in Redis, and tell their buyers.
-- Until the rebuild's keys are written (meta's epoch newer than the reservations'),
-- nothing changes: the rebuild rewrites every status, and would erase what this wrote.
--
-- KEYS[1] stream   KEYS[2] status   KEYS[3] meta
-- ARGV[1] consumer group   ARGV[2] the reason buyers are told
-- ARGV[3] the newest epoch among the reservations
-- ARGV[4..] pairs: stream entry id, user id
--
-- Returns (mirrored by Dropped in core/src/orders/redis.rs):
--    1 DROPPED  dropped; each buyer with no status (the rebuild wrote none) is FAILED
--    0 NOT_YET  the rebuild is not in Redis yet: nothing changed
local rcall = redis.call
local epoch = tonumber(rcall('HGET', KEYS[3], 'epoch') or '0')
if epoch <= tonumber(ARGV[3]) then return 0 end
for i = 4, #ARGV, 2 do
  rcall('XACK', KEYS[1], ARGV[1], ARGV[i])
  rcall('XDEL', KEYS[1], ARGV[i])
  rcall('HSETNX', KEYS[2], ARGV[i + 1], 'FAILED:' .. ARGV[2])
end
return 1
