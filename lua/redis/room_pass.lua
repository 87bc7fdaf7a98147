-- room_pass.lua: a queue pass admits one purchase (docs/waiting-room.md). `use` claims
-- the pass for a purchase (the buyer and its Idempotency-Key) before reserve.lua runs;
-- `give` hands it back when that purchase was refused, so the buyer may try again with
-- the same pass while it is good.
--
-- KEYS[1] room     hash  `used`: passes claimed
-- KEYS[2] used     hash  pass id → "<user>:<Idempotency-Key>" of the purchase it admitted
-- KEYS[3] usedpos  zset  positions whose pass was claimed (room passes; hidden-path
--                        passes, "h<n>", are not positions)
-- ARGV[1] use | give
-- ARGV[2] pass id
-- ARGV[3] "<user>:<Idempotency-Key>"
--
-- Returns, for `use` (mirrored by PassUse in core/src/room/store.rs):
--    1 CLAIMED  the pass is this purchase's now
--    2 SAME     it was already this purchase's (a repeat of its key)
--    0 TAKEN    another purchase used it
-- and for `give`: 1 given back, 0 it was not this purchase's.
local rcall = redis.call
local id, owner = ARGV[2], ARGV[3]
local held = rcall('HGET', KEYS[2], id)
local position = string.match(id, '^%d+$')
if ARGV[1] == 'use' then
  if held == owner then return 2 end
  if held then return 0 end
  rcall('HSET', KEYS[2], id, owner)
  if position then rcall('ZADD', KEYS[3], position, position) end
  rcall('HINCRBY', KEYS[1], 'used', 1)
  return 1
end
if held ~= owner then return 0 end
rcall('HDEL', KEYS[2], id)
if position then rcall('ZREM', KEYS[3], position) end
rcall('HINCRBY', KEYS[1], 'used', -1)
return 1
