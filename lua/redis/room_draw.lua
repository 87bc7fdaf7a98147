-- room_draw.lua: the gate's first step of the draw at the open (docs/waiting-room.md):
-- once Redis's clock has reached the open, no one joins `early` any more; answers how
-- many did. The gate then orders them (core/src/room/lottery.rs), writes their
-- positions 1..N into `pos` and marks the room drawn with the seed revealed.
--
-- KEYS[1] room   hash
-- KEYS[2] early  zset  user → arrival number
--
-- Returns {code, n} (mirrored by Draw in core/src/room/store.rs):
--    1 CLOSED    early joins closed; n joined before the open
--    0 TOO_SOON  the open is n milliseconds away
--    2 DRAWN     already drawn
--    3 OFF       no room (or its keys are not loaded)
local rcall = redis.call
local f = rcall('HMGET', KEYS[1], 'enabled', 'start_ms', 'drawn')
if not f[2] then return {3, 0} end
if f[3] == '1' then return {2, 0} end
local t = rcall('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if now < tonumber(f[2]) then return {0, tonumber(f[2]) - now} end
rcall('HSET', KEYS[1], 'early_closed', 1)
return {1, rcall('ZCARD', KEYS[2])}
