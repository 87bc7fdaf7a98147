-- sold.lua: a paid order's seats go locked (or pending) → sold, and the buyer's status
-- becomes PAID.
--
-- KEYS[1] seats (the order's category's)   KEYS[2] status
-- ARGV[1] order no   ARGV[2] user id   ARGV[3] seats "r:c,r:c" or ""
--
-- Returns (mirrored by Sold in core/src/lifecycle/pay.rs):
--   n >= 0  seats moved to sold (0 for an unseated order, or when done before)
local rcall = redis.call
local order = ARGV[1]
local moved = 0
for seat in string.gmatch(ARGV[3], '[^,]+') do
  -- Pending: an event of several buckets whose core stopped before confirming the
  -- seats of this (admitted, now paid) order.
  local state = rcall('HGET', KEYS[1], seat)
  if state == 'L:' .. order or state == 'P:' .. order then
    rcall('HSET', KEYS[1], seat, 'S:' .. order)
    moved = moved + 1
  end
end
-- QUEUED too: the order (its number is the request id) may be paid before its batch's
-- settle marked it CREATED (a settle that failed and waits to be replayed), and the
-- settle then leaves a status that no longer says QUEUED alone.
local status = rcall('HGET', KEYS[2], ARGV[2])
if status == 'CREATED:' .. order or status == 'QUEUED:' .. order then
  rcall('HSET', KEYS[2], ARGV[2], 'PAID:' .. order)
end
return moved
