-- room_pause.lua: a sale closed and reopened keeps the turns it interrupted
-- (docs/waiting-room.md "Closing and reopening"). A pass's time runs from its release
-- (a step's ms) only while the sale is open in Redis: `pause`, run before a closed
-- status is written, notes when (Redis's clock); `resume`, run before an open one is,
-- moves every step that was alive then (its passes still in their time at the close)
-- later by the time the sale was closed, so each of those passes has the time it had
-- left, and the gate's count of passes out keeps them. While paused the gate releases
-- nobody (room_release.lua). The passes signed before carry their old expiry: a poll
-- answers the buyer a new one. Steps already over at the close stay as they were.
-- Repeated, either does nothing more: the first close's moment stands, and a resume
-- clears it.
--
-- KEYS[1] room   hash  `paused_ms`: when the sale was closed; `ttl_ms`: a pass's time
-- KEYS[2] steps  zset  the releases "<from>:<upto>:<ms>", scored by ms (room_release.lua)
-- ARGV[1] pause | resume
--
-- Returns (mirrored by Resumed in core/src/room/store.rs): {steps moved, ms they moved
-- by} (both 0 for pause, and for a resume with nothing paused).
local rcall = redis.call
local t = rcall('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if ARGV[1] == 'pause' then
  rcall('HSETNX', KEYS[1], 'paused_ms', now)
  return {0, 0}
end
local paused = tonumber(rcall('HGET', KEYS[1], 'paused_ms') or '')
if not paused then return {0, 0} end
rcall('HDEL', KEYS[1], 'paused_ms')
local by = now - paused
local ttl = tonumber(rcall('HGET', KEYS[1], 'ttl_ms') or '0')
if by <= 0 or ttl <= 0 then return {0, 0} end
local moved = 0
local alive = rcall('ZRANGEBYSCORE', KEYS[2], '(' .. (paused - ttl), '+inf', 'WITHSCORES')
for i = 1, #alive, 2 do
  local from, upto, ms = string.match(alive[i], '^(%d+):(%d+):(%d+)$')
  if from then
    rcall('ZREM', KEYS[2], alive[i])
    rcall('ZADD', KEYS[2], tonumber(alive[i + 1]) + by, from .. ':' .. upto .. ':' .. (tonumber(ms) + by))
    moved = moved + 1
  end
end
return {moved, by}
