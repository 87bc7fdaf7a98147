-- seat_free.lua: seats held for a request or order that will not keep them go back on
-- sale, with their units (events of several buckets, whose seats are in the event's own
-- slot): a pending lock the purchase did not get (`P:<request id>`), a reservation that
-- failed or an order cancelled unpaid (`L:<order no>`). A seat in any other state is
-- left alone, so running it again changes nothing.
--
-- KEYS[1] seats   KEYS[2] rowfree   (the category's)
-- KEYS[3] pool    hash category id → units for sale
-- KEYS[4] soldout the edge's flag   KEYS[5] locks   KEYS[6] records (as seat_lock.lua)
-- ARGV[1] request id / order no   ARGV[2] category id   ARGV[3] seats "r:c,r:c"
--
-- Returns (mirrored by Freed in core/src/admission/seat_lock.rs):
--   n >= 0  seats freed now
local rcall = redis.call
local id, cid = ARGV[1], ARGV[2]
local pending, lock = 'P:' .. id, 'L:' .. id
local freed = 0
for seat in string.gmatch(ARGV[3], '[^,]+') do
  local state = rcall('HGET', KEYS[1], seat)
  if state == pending or state == lock then
    rcall('HSET', KEYS[1], seat, 'F')
    rcall('HINCRBY', KEYS[2], string.match(seat, '^(%d+):'), 1)
    freed = freed + 1
  end
end
if freed > 0 and rcall('HINCRBY', KEYS[3], cid, freed) > 0 then rcall('HDEL', KEYS[4], cid) end
local record = rcall('HGET', KEYS[6], id)
if record then
  local user, key = string.match(record, '^[^|]*|([^|]*)|[^|]*|[^|]*|(.*)$')
  rcall('HDEL', KEYS[6], id, 'k:' .. user .. ':' .. key)
end
rcall('ZREM', KEYS[5], id)
return freed
