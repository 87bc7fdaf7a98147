-- room_release.lua: the gate's tick (docs/waiting-room.md "Release"). Lets the next
-- buyers in line have their turn — at most `budget` of them, and only as many as the
-- stock left can serve beyond the passes still out: a pass is out from its release
-- until it is used or its time is up, and one pass buys at least one unit. Passes whose
-- time ran out unused no longer count, so their units go to the next in line.
--
-- Each release is a step "<from>:<upto>:<ms>" in `steps` (scored by ms): positions
-- from+1..upto had their turn from ms on, for ttl_ms. Releases within ARGV[5] ms of the
-- last step extend it (so there are at most about ttl ÷ that many steps alive; a pass
-- released into an extended step expires up to that much early). The steps alive cover
-- the positions after the oldest one's `from` up to `served`, so the passes out are
-- those positions less the ones used: one range count.
--
-- KEYS[1] room     hash  served (last position released), rate_now, out, expired
-- KEYS[2] steps    zset  the releases
-- KEYS[3] usedpos  zset  positions whose pass bought (room_pass.lua)
-- KEYS[4] pos      zset  user → position
-- ARGV[1] budget   most positions to release now
-- ARGV[2] units    stock left, all categories
-- ARGV[3] ttl_ms   how long a pass is good for
-- ARGV[4] rate     the release rate in force (for the buyers' estimates; 0 is written
--                  instead while the stock left is all spoken for by passes out)
-- ARGV[5] merge_ms releases this close to the last step join it
-- ARGV[6] done_seq the room's `done_seq` when the units were read: passes settled as
--                  used since may have taken units the read still counted, so each
--                  counts against the room left (at worst one too many: never fewer)
--
-- Returns (mirrored by Released in core/src/room/store.rs):
-- {served, released now, passes out, expired unused, still waiting} (while paused: the
-- figures the last release wrote, none released).
local rcall = redis.call
-- The sale closed (room_pause.lua): nobody gets a turn, and no step is cleaned up, until
-- its reopen has moved the turns the close interrupted.
if rcall('HEXISTS', KEYS[1], 'paused_ms') == 1 then
  local f = rcall('HMGET', KEYS[1], 'served', 'out', 'expired')
  local held = tonumber(f[1] or '0')
  return {held, 0, tonumber(f[2] or '0'), tonumber(f[3] or '0'),
    math.max(0, rcall('ZCARD', KEYS[4]) - held)}
end
local t = rcall('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[3])
local served = tonumber(rcall('HGET', KEYS[1], 'served') or '0')
local out = 0
local oldest = rcall('ZRANGEBYSCORE', KEYS[2], '(' .. (now - ttl), '+inf', 'LIMIT', 0, 1)[1]
if oldest then
  local from = tonumber(string.match(oldest, '^(%d+):'))
  out = (served - from) - rcall('ZCOUNT', KEYS[3], from + 1, served)
end
local waiting = rcall('ZCARD', KEYS[4]) - served
local settled_since = tonumber(rcall('HGET', KEYS[1], 'done_seq') or '0') - tonumber(ARGV[6])
local room_left = tonumber(ARGV[2]) - out - settled_since
local n = math.min(tonumber(ARGV[1]), room_left, waiting)
rcall('HSET', KEYS[1], 'rate_now', (room_left <= 0 and waiting > 0) and 0 or ARGV[4])
if n > 0 then
  local last = rcall('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')
  if last[1] and now - tonumber(last[2]) < tonumber(ARGV[5]) then
    local from = string.match(last[1], '^(%d+):')
    rcall('ZREM', KEYS[2], last[1])
    rcall('ZADD', KEYS[2], last[2], from .. ':' .. (served + n) .. ':' .. last[2])
  else
    rcall('ZADD', KEYS[2], now, served .. ':' .. (served + n) .. ':' .. now)
  end
  served = served + n
  rcall('HSET', KEYS[1], 'served', served)
  out = out + n
else
  n = 0
end
-- Steps long past their passes' time are of no use to anyone.
rcall('ZREMRANGEBYSCORE', KEYS[2], '-inf', now - ttl - 600000)
local expired = math.max(0, served - rcall('ZCARD', KEYS[3]) - out)
rcall('HSET', KEYS[1], 'out', out, 'expired', expired)
return {served, n, out, expired, math.max(0, waiting - n)}
