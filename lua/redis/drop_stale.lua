-- drop_stale.lua: drop reservations taken under an older generation of the event's
-- keys (a rebuild from MySQL counted their units as free: they must never become
-- orders, nor be given back), once the rebuild is in Redis, and tell their buyers.
-- Until the rebuild's keys are written (meta's epoch newer than the reservations'),
-- nothing changes: the rebuild rewrites every status, and would erase what this wrote.
--
-- KEYS[1] stream   KEYS[2] status   KEYS[3] meta
-- ARGV[1] consumer group   ARGV[2] the reason buyers are told
-- ARGV[3] the newest epoch among the reservations
-- ARGV[4..] triples: stream entry id, user id, the reservation's number
--
-- Returns (mirrored by Dropped in core/src/orders/redis.rs):
--    1 DROPPED  dropped; each buyer whose status is of no purchase or an earlier one
--               is FAILED ("FAILED:<number>:<reason>"); any other reservation not
--               already an order keeps that as its own record ("r:<user>:<number>",
--               as reserve.lua keeps one a newer purchase replaced)
--    0 NOT_YET  the rebuild is not in Redis yet: nothing changed
--
-- The rebuild wrote each buyer's latest order from MySQL: a status naming an order
-- numbered before the dropped reservation (an earlier purchase of the buyer's), or none
-- at all, is about a purchase older than this one, and would read as its outcome
-- (release.lua and refuse.lua mark FAILED only the status of their own purchase, for
-- the same reason). A status naming the reservation's own number is its order, which
-- MySQL had before the rebuild (the order is the request's number; its entry was never
-- settled): it stays, as does a FAILED one, and a QUEUED one, which only a purchase
-- admitted since the rebuild writes (the rebuild writes orders' statuses only; its
-- number may be the smaller, minted by a core whose clock is behind).
local rcall = redis.call
local match = string.match

-- Numbers as decimal strings (past 2^53 a Lua number rounds): fewer digits is smaller.
local function before(n, rid)
  return #n < #rid or (#n == #rid and n < rid)
end

local epoch = tonumber(rcall('HGET', KEYS[3], 'epoch') or '0')
if epoch <= tonumber(ARGV[3]) then return 0 end
for i = 4, #ARGV, 3 do
  local entry, user, rid = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  rcall('XACK', KEYS[1], ARGV[1], entry)
  rcall('XDEL', KEYS[1], entry)
  local now = rcall('HGET', KEYS[2], user)
  local kind, n
  if now then kind, n = match(now, '^(%u+):(%d+)') end
  local failed = 'FAILED:' .. rid .. ':' .. ARGV[2]
  if not now or (n and kind ~= 'FAILED' and kind ~= 'QUEUED' and before(n, rid)) then
    rcall('HSET', KEYS[2], user, failed)
  elseif n ~= rid then
    rcall('HSET', KEYS[2], 'r:' .. user .. ':' .. rid, failed)
  end
end
return 1
