-- refuse.lua: a reservation MySQL turned away (Redis admitted more than MySQL holds:
-- its state was behind). Marks it FAILED with the reason and drops its entry, and gives
-- no stock back: Redis had offered what was not there, so its units and seats stay
-- taken (Redis shows less, never more; the reconciler or a rebuild puts them right).
-- The buyer's share is given back unless the refusal was the buyer's limit (ARGV[8]):
-- the buyer holds nothing of a refused reservation, and a share left behind told them
-- LIMIT_REACHED for units they never got; over the limit, Redis was behind on what
-- they hold, and the share brings it closer. With a cap, the category's stock is lowered to at most the cap,
-- the units MySQL has left — only if no unit came into this bucket since the batch's
-- transaction read that: no cancelled order given back into it, no move credited to it
-- (the two sets' sizes are what the core read before it; a unit given back into
-- another bucket can reach this one by a move). A unit that came in meanwhile is not
-- in the cap, and lowering the stock to it would take that unit off sale (Redis never
-- raises stock while a sale runs). Without the cap, Redis stays ahead and a later refusal caps it. Runs at
-- most once per reservation: the entry's acknowledgement is the guard.
--
-- KEYS[1] stream   KEYS[2] status   KEYS[3] stock   KEYS[4] soldout   KEYS[5] held
-- KEYS[6] meta (its epoch: a share is given back only under the keys that took it)
-- KEYS[7] restocked  set  the bucket's cancelled orders given back (restock.lua)
-- KEYS[8] credited   set  the moves credited to the bucket (move_in.lua)
-- ARGV[1] consumer group   ARGV[2] stream entry id   ARGV[3] request id
-- ARGV[4] user id          ARGV[5] category id       ARGV[6] reason
-- ARGV[7] cap on the category's stock, or -1 for none
-- ARGV[8] the buyer's share to give back (the reservation's quantity), or 0
-- ARGV[9] the reservation's epoch: a rebuild since (a newer epoch, or meta gone while
--         one is due) wrote every share from MySQL, without this one — given back
--         again, the buyer would read less than they hold
-- ARGV[10] the restocked and credited sets' sizes, summed, before the batch's
--         transaction: the cap applies only while the sum is the same (both only grow)
--
-- Returns (mirrored by Refused in core/src/orders/redis.rs):
--    1 REFUSED       refused now
--    0 ALREADY_DONE  the entry was no longer pending: nothing changed
local rcall = redis.call
local group, entry, rid, user, cid = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local cap = tonumber(ARGV[7])
if rcall('XACK', KEYS[1], group, entry) == 0 then return 0 end
rcall('XDEL', KEYS[1], entry)
if cap >= 0 and rcall('SCARD', KEYS[7]) + rcall('SCARD', KEYS[8]) == tonumber(ARGV[10])
    and tonumber(rcall('HGET', KEYS[3], cid) or '0') > cap then
  rcall('HSET', KEYS[3], cid, cap)
  if cap == 0 then rcall('HSET', KEYS[4], cid, 1) end
end
local share = tonumber(ARGV[8])
if share > 0 then
  -- Loaded (a status) and of the reservation's epoch (absent: 0, as reserve.lua writes).
  local meta = rcall('HMGET', KEYS[6], 'status', 'epoch')
  if meta[1] and tonumber(meta[2] or '0') == tonumber(ARGV[9]) then
    if rcall('HINCRBY', KEYS[5], user, -share) <= 0 then rcall('HDEL', KEYS[5], user) end
  end
end
-- The buyer's status if it is still this purchase's; else the purchase's own record
-- (a newer one replaced it as the buyer's latest, or a rebuild wrote the statuses),
-- while the keys are there (gone, a rebuild or the purge deletes the statuses).
local failed = 'FAILED:' .. rid .. ':' .. ARGV[6]
local now = rcall('HGET', KEYS[2], user)
if now == 'QUEUED:' .. rid then
  rcall('HSET', KEYS[2], user, failed)
elseif rcall('EXISTS', KEYS[6]) == 1 and string.match(now or '', '^%u+:(%d+)') ~= rid then
  rcall('HSET', KEYS[2], 'r:' .. user .. ':' .. rid, failed)
end
return 1
