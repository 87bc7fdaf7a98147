-- refuse.lua: a reservation MySQL turned away (Redis admitted more than MySQL holds:
-- its state was behind). Marks it FAILED with the reason and drops its entry, and gives
-- nothing back: Redis had offered what was not there, so its units, seats and the
-- buyer's share stay taken (Redis shows less, never more; the reconciler or a rebuild
-- puts them right). With a cap, the category's stock is lowered to at most the cap,
-- the units MySQL has left. Runs at most once per reservation: the entry's
-- acknowledgement is the guard.
--
-- KEYS[1] stream   KEYS[2] status   KEYS[3] stock   KEYS[4] soldout
-- ARGV[1] consumer group   ARGV[2] stream entry id   ARGV[3] request id
-- ARGV[4] user id          ARGV[5] category id       ARGV[6] reason
-- ARGV[7] cap on the category's stock, or -1 for none
--
-- Returns (mirrored by Refused in core/src/orders/redis.rs):
--    1 REFUSED       refused now
--    0 ALREADY_DONE  the entry was no longer pending: nothing changed
local rcall = redis.call
local group, entry, rid, user, cid = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local cap = tonumber(ARGV[7])
if rcall('XACK', KEYS[1], group, entry) == 0 then return 0 end
rcall('XDEL', KEYS[1], entry)
if cap >= 0 and tonumber(rcall('HGET', KEYS[3], cid) or '0') > cap then
  rcall('HSET', KEYS[3], cid, cap)
  if cap == 0 then rcall('HSET', KEYS[4], cid, 1) end
end
if rcall('HGET', KEYS[2], user) == 'QUEUED:' .. rid then
  rcall('HSET', KEYS[2], user, 'FAILED:' .. ARGV[6])
end
return 1
