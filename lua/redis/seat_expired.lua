-- seat_expired.lua: the pending seat locks whose time has passed by this master's clock,
-- for the sweeper to settle (confirm if reserve.lua admitted the purchase, else free).
--
-- KEYS[1] locks   KEYS[2] records (as seat_lock.lua)
-- ARGV[1] most locks to return
--
-- Returns (mirrored by Due in core/src/admission/seat_lock.rs) a flat list: request
-- id, record, request id, record, …
local rcall = redis.call
local t = rcall('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local due = rcall('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
local out = {}
for _, rid in ipairs(due) do
  local record = rcall('HGET', KEYS[2], rid)
  if record then
    out[#out + 1] = rid
    out[#out + 1] = record
  else
    rcall('ZREM', KEYS[1], rid)
  end
end
return out
