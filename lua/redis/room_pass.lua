-- room_pass.lua: a queue pass admits one purchase (docs/waiting-room.md "One purchase per
-- pass"). A purchase claims the pass before reserve.lua runs (`use`), and settles the
-- claim after: `done` once admitted (or when the outcome is unknown), `give` when
-- refused — the buyer may then try again with the same pass while it is good.
--
-- A claim is held by one request: `<owner>|<nonce>|<ms>` while pending (owner: the
-- buyer and the purchase's Idempotency-Key; nonce: that request's; ms: Redis's time of
-- the claim), `<owner>|done` once settled. Another request of the same purchase waits
-- while a claim is pending (IN_FLIGHT) and goes on once it is done (SAME: it will get
-- that purchase's first answer), so a refused request never gives back a pass a twin
-- request used. A claim pending longer than ARGV[5] ms (its core stopped) counts as done.
--
-- A pass counts as used (`usedpos`, `used`, `done_seq`) only once its purchase is
-- settled, after reserve.lua took the units: while a claim is pending its pass is still
-- out for the gate (room_release.lua), so the units left and the passes out never both
-- miss it.
--
-- KEYS[1] room     hash  `used`: passes used; `done_seq`: claims settled as used, ever
-- KEYS[2] used     hash  pass id → the claim
-- KEYS[3] usedpos  zset  positions whose pass was used (room passes; hidden-path
--                        passes, "h<n>", are not positions)
-- ARGV[1] use | done | give
-- ARGV[2] pass id
-- ARGV[3] owner "<user>:<Idempotency-Key>"
-- ARGV[4] nonce of the request
-- ARGV[5] use: the pass's expiry (ms); done, give: unused
-- ARGV[6] use: how long a claim may stay pending (ms)
--
-- Returns (mirrored by PassUse in core/src/room/store.rs):
--    1 CLAIMED    use: the pass is this request's now (settle it with done or give);
--                 done, give: settled
--    2 SAME       use: the purchase already used it (a repeat of its key)
--    3 IN_FLIGHT  use: another request of this purchase holds it: ask again shortly
--    4 EXPIRED    use: the pass's time is up (by Redis's clock)
--    0 TAKEN      use: another purchase used it; done, give: the claim is not this request's
local rcall = redis.call
local op, id, owner, nonce = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local held = rcall('HGET', KEYS[2], id)
local position = string.match(id, '^%d+$')
local t = rcall('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local pending = owner .. '|' .. nonce .. '|'
local function spent()
  rcall('HSET', KEYS[2], id, owner .. '|done')
  if position then rcall('ZADD', KEYS[3], position, position) end
  rcall('HINCRBY', KEYS[1], 'used', 1)
  rcall('HINCRBY', KEYS[1], 'done_seq', 1)
end
if op == 'use' then
  if held then
    if held == owner .. '|done' then return 2 end
    local who, at = string.match(held, '^(.*)|[^|]*|(%d+)$')
    if who ~= owner then return 0 end
    if now - tonumber(at) > tonumber(ARGV[6]) then
      spent()
      return 2
    end
    return 3
  end
  if now >= tonumber(ARGV[5]) then return 4 end
  rcall('HSET', KEYS[2], id, pending .. now)
  return 1
end
if not held or string.sub(held, 1, #pending) ~= pending then return 0 end
if op == 'done' then
  spent()
  return 1
end
rcall('HDEL', KEYS[2], id)
return 1
