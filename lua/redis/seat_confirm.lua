-- seat_confirm.lua: a purchase reserve.lua admitted keeps the seats seat_lock.lua took
-- for it: `P:<request id>` → `L:<request id>`, and its pending lock is forgotten.
-- Idempotent: a seat already `L:<request id>` counts as confirmed.
--
-- KEYS[1] seats (the category's)   KEYS[2] locks   KEYS[3] records (as seat_lock.lua)
-- ARGV[1] request id   ARGV[2] seats "r:c,r:c"
--
-- Returns (mirrored by Confirmed in core/src/admission/seat_lock.rs):
--   n >= 0  seats now locked for the request (fewer than asked: a seat was lost)
local rcall = redis.call
local rid = ARGV[1]
local pending, lock = 'P:' .. rid, 'L:' .. rid
local held = 0
for seat in string.gmatch(ARGV[2], '[^,]+') do
  local state = rcall('HGET', KEYS[1], seat)
  if state == pending then
    rcall('HSET', KEYS[1], seat, lock)
    held = held + 1
  elseif state == lock then
    held = held + 1
  end
end
rcall('ZREM', KEYS[2], rid)
rcall('HDEL', KEYS[3], rid)
return held
