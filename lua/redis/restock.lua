-- restock.lua: give a cancelled order's units and seats back, exactly once (the order
-- number's entry in the restocked set is the guard).
--
-- KEYS[1] restocked  set   order numbers already given back
-- KEYS[2] stock      KEYS[3] soldout   KEYS[4] held    KEYS[5] status
-- KEYS[6] seats      KEYS[7] rowfree   (the order's category's)
-- ARGV[1] order no   ARGV[2] user id   ARGV[3] category id   ARGV[4] quantity
-- ARGV[5] seats "r:c,r:c" or ""
-- ARGV[6] units back into KEYS[2]: the quantity, or 0 when the seats' own slot takes them back (seat_free.lua: an event of several
--         buckets, ARGV[5] then ""); a journey gives back the seat-segments it
--         really freed instead
-- ARGV[7] a train journey "<from>:<to>", or "": its seats' segments go back
--         (lib/segments.lua; KEYS[6] is then the class's segments hash, KEYS[7] its
--         version hash)
--
-- Returns (mirrored by Restocked in core/src/lifecycle/restock.rs):
--    1 NOW     given back now
--    0 BEFORE  given back before: nothing changed
local rcall = redis.call
local order, user, cid, qty = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4])
if rcall('SADD', KEYS[1], order) == 0 then return 0 end
-- Seats first: a journey's units back are the seat-segments it really gave back.
local back = seats_give_back(KEYS[6], KEYS[7], KEYS[3], cid, ARGV[5], ARGV[7], 'L:' .. order) or tonumber(ARGV[6])
if back > 0 and rcall('HINCRBY', KEYS[2], cid, back) > 0 then rcall('HDEL', KEYS[3], cid) end
if rcall('HINCRBY', KEYS[4], user, -qty) <= 0 then rcall('HDEL', KEYS[4], user) end
-- QUEUED too: cancelled before its batch's settle marked it CREATED (sold.lua says why).
local status = rcall('HGET', KEYS[5], user)
if status == 'CREATED:' .. order or status == 'QUEUED:' .. order then
  rcall('HSET', KEYS[5], user, 'CANCELLED:' .. order)
end
return 1
