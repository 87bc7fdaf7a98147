-- release.lua: give back one reservation that will never become an order: its units,
-- its seats and its share of the user's limit, then mark it FAILED and drop its entry.
-- Runs at most once per reservation: the entry's acknowledgement is the guard. Under
-- keys rebuilt from MySQL since the reservation was admitted (a newer epoch in KEYS[8],
-- or the keys fenced for a rebuild: no status there) it gives nothing back: the rebuild
-- counted its units, seats and share as free already (the reservation was never an
-- order in MySQL), and giving them back again would offer them twice.
--
-- KEYS[1] stream   KEYS[2] status   KEYS[3] stock   KEYS[4] soldout   KEYS[5] held
-- KEYS[6] seats    KEYS[7] rowfree  (the reservation's category's)
-- KEYS[8] meta     the bucket's (its status and epoch)
-- ARGV[1] consumer group   ARGV[2] stream entry id   ARGV[3] request id
-- ARGV[4] user id          ARGV[5] category id       ARGV[6] quantity
-- ARGV[7] seats "r:c,r:c" or ""                      ARGV[8] reason
-- ARGV[9] units back into KEYS[3]: the quantity, or 0 when the seats' own slot takes them back (seat_free.lua: an event of several
--         buckets, ARGV[7] then ""); a journey gives back the seat-segments it
--         really freed instead
-- ARGV[10] a train journey "<from>:<to>", or "": its seats' segments go back
--         (lib/segments.lua; KEYS[6] is then the class's segments hash, KEYS[7] its
--         version hash)
-- ARGV[11] the reservation's epoch (absent from its entry: 0, as reserve.lua writes)
--
-- Returns (mirrored by Released in core/src/orders/redis.rs):
--    1 RELEASED      released
--    0 ALREADY_DONE  already released or settled (the entry was no longer pending):
--                    nothing changed
local rcall = redis.call
local group, entry, rid, user, cid = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local qty = tonumber(ARGV[6])
if rcall('XACK', KEYS[1], group, entry) == 0 then return 0 end
rcall('XDEL', KEYS[1], entry)
local meta = rcall('HMGET', KEYS[8], 'status', 'epoch')
if meta[1] and tonumber(meta[2] or '0') == tonumber(ARGV[11]) then
  -- Seats first: a journey's units back are the seat-segments it really gave back.
  local back = seats_give_back(KEYS[6], KEYS[7], KEYS[4], cid, ARGV[7], ARGV[10], 'L:' .. rid) or tonumber(ARGV[9])
  if back > 0 and rcall('HINCRBY', KEYS[3], cid, back) > 0 then rcall('HDEL', KEYS[4], cid) end
  if rcall('HINCRBY', KEYS[5], user, -qty) <= 0 then rcall('HDEL', KEYS[5], user) end
end
-- The buyer's status if it is still this purchase's; else the purchase's own record
-- (a newer one replaced it as the buyer's latest, or a rebuild wrote the statuses),
-- while the keys are there (gone, a rebuild or the purge deletes the statuses).
local failed = 'FAILED:' .. rid .. ':' .. ARGV[8]
local now = rcall('HGET', KEYS[2], user)
if now == 'QUEUED:' .. rid then
  rcall('HSET', KEYS[2], user, failed)
elseif meta[1] and string.match(now or '', '^%u+:(%d+)') ~= rid then
  rcall('HSET', KEYS[2], 'r:' .. user .. ':' .. rid, failed)
end
return 1
