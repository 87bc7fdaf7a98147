-- settle.lua: after a batch's orders are committed in MySQL, mark each purchase CREATED
-- and remove its entry from the event's stream (acknowledged and deleted, so the
-- stream's length is the backlog admission checks).
--
-- KEYS[1]  stream  the event's reservations
-- KEYS[2]  status  hash user id → latest purchase status; "r:<user>:<request id>" → a
--                  replaced purchase's (reserve.lua)
-- ARGV[1]  the consumer group
-- ARGV[2..] triples: stream entry id, user id, request id (= order number); at most
--           128 of them a run (SETTLE_CHUNK in core/src/orders/redis.rs: a run holds
--           Redis about a millisecond)
--
-- A status is changed only while it still says "QUEUED:<that request>", so a replay
-- never overwrites a newer purchase of the same user; a purchase a newer one replaced
-- loses its own record ("r:<user>:<request id>", reserve.lua): its order tells now.
-- The entries are acknowledged and deleted by one XACK and one XDEL for the run, not
-- one of each per entry.
--
-- Returns (mirrored by Settled in core/src/orders/redis.rs):
--   n >= 0  the number of entries acknowledged
local rcall, unpack = redis.call, unpack
local entries = {}
for i = 2, #ARGV, 3 do
  local entry, user, rid = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  if rcall('HGET', KEYS[2], user) == 'QUEUED:' .. rid then
    rcall('HSET', KEYS[2], user, 'CREATED:' .. rid)
  else
    -- Replaced as the buyer's latest while queued: its order in MySQL tells now.
    rcall('HDEL', KEYS[2], 'r:' .. user .. ':' .. rid)
  end
  entries[#entries + 1] = entry
end
if #entries == 0 then return 0 end
local acked = rcall('XACK', KEYS[1], ARGV[1], unpack(entries))
rcall('XDEL', KEYS[1], unpack(entries))
return acked
