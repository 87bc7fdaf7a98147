-- room_join.lua: a buyer joins an event's waiting room (docs/waiting-room.md). One place
-- per user: joining again answers the place already held.
--
-- Before the sale opens (Redis's clock) a joiner is recorded in arrival order in
-- `early`; at the open the gate draws their order from the committed seed and writes
-- their positions 1..N into `pos`. From the open on, a joiner goes behind them in arrival
-- order: position N + k for the k-th to join late, written at once. The first join at or
-- after the open closes `early` for good (`early_closed`), so N never changes after it.
--
-- KEYS[1] room   hash  the room's settings and counters
-- KEYS[2] early  zset  user → arrival number (joined before the open)
-- KEYS[3] pos    zset  user → position (after the draw, or joined after the open)
-- ARGV[1] user id
--
-- Returns {code, n} (mirrored by Joined in core/src/room/store.rs):
--    1 PLACED   n: the buyer's position
--    2 EARLY    n: arrival number; joined before the open, the position comes at the draw
--    3 NOT_YET  n: the room opens at this time (ms)
--    4 ENDED    the sale is over
--    5 OFF      no room for this event (or its keys are not loaded)
local rcall = redis.call
local user = ARGV[1]
local f = rcall('HMGET', KEYS[1], 'enabled', 'opens_ms', 'start_ms', 'end_ms', 'early_closed')
if f[1] ~= '1' then return {5} end
local t = rcall('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if now < tonumber(f[2]) then return {3, tonumber(f[2])} end
if now >= tonumber(f[4]) then return {4} end
local p = rcall('ZSCORE', KEYS[3], user)
if p then return {1, tonumber(p)} end
local e = rcall('ZSCORE', KEYS[2], user)
if e then return {2, tonumber(e)} end
if now < tonumber(f[3]) and f[5] ~= '1' then
  local n = rcall('HINCRBY', KEYS[1], 'joined', 1)
  rcall('ZADD', KEYS[2], n, user)
  return {2, n}
end
if f[5] ~= '1' then rcall('HSET', KEYS[1], 'early_closed', 1) end
rcall('HINCRBY', KEYS[1], 'joined', 1)
local late = rcall('HINCRBY', KEYS[1], 'late', 1)
local position = rcall('ZCARD', KEYS[2]) + late
rcall('ZADD', KEYS[3], position, user)
return {1, position}
