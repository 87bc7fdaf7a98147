-- seat_confirm.lua: a purchase reserve.lua admitted keeps the seats seat_lock.lua took
-- for it: `P:<request id>` → `L:<request id>`, its pending lock is forgotten, and the
-- edge's flag goes up if the category has no unit left. Idempotent: a seat already
-- `L:` or `S:` of the request counts as kept.
--
-- KEYS[1] seats (the category's)   KEYS[2] pool   KEYS[3] soldout (the edge's flag)
-- KEYS[4] locks   KEYS[5] records (as seat_lock.lua)
-- ARGV[1] request id   ARGV[2] category id   ARGV[3] seats "r:c,r:c"
--
-- Returns (mirrored by Confirmed in core/src/admission/seat_lock.rs):
--   n >= 0  seats now the request's (fewer than asked: a seat was lost)
local rcall = redis.call
local rid, cid = ARGV[1], ARGV[2]
local pending, lock, sold = 'P:' .. rid, 'L:' .. rid, 'S:' .. rid
local held = 0
for seat in string.gmatch(ARGV[3], '[^,]+') do
  local state = rcall('HGET', KEYS[1], seat)
  if state == pending then
    rcall('HSET', KEYS[1], seat, lock)
    held = held + 1
  elseif state == lock or state == sold then
    held = held + 1
  end
end
if tonumber(rcall('HGET', KEYS[2], cid) or '0') <= 0 then rcall('HSET', KEYS[3], cid, 1) end
local record = rcall('HGET', KEYS[5], rid)
if record then
  local user, key = string.match(record, '^[^|]*|([^|]*)|[^|]*|[^|]*|(.*)$')
  rcall('HDEL', KEYS[5], rid, 'k:' .. user .. ':' .. key)
end
rcall('ZREM', KEYS[4], rid)
return held
