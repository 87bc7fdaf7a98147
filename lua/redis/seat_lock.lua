-- seat_lock.lua: the first step of a seated purchase in an event of several buckets
-- (docs/scaling.md "Seated categories"): the seats live in the event's own slot, the
-- buyer's limit, status and stream in their bucket's. Takes the chosen seats (or the best
-- free ones, as reserve.lua picks them: lib/seat_pick.lua is loaded in front of this script)
-- as pending, `P:<request id>`, and their units out of the event's stock of the
-- category (the edge's flag waits for the confirmation). The core then runs reserve.lua
-- on the buyer's bucket ("locked-…" mode) and confirms the seats (seat_confirm.lua) or
-- frees them (seat_free.lua); a pending lock nobody confirmed is settled by the sweeper
-- once ARGV[9] ms have passed. Running it again for the same request answers the same
-- seats; while one request of a user's Idempotency-Key holds a lock, another request
-- with that key is told IN_FLIGHT (the core waits for the first one's answer).
--
-- KEYS[1] meta       the event's (status, sale_start_ms, sale_end_ms)
-- KEYS[2] pool       hash category id → units for sale (a seated category's all here)
-- KEYS[3] soldout    hash category id → 1: the edge's flag (set by seat_confirm.lua)
-- KEYS[4] seats      KEYS[5] rowfree   (the category's)
-- KEYS[6] locks      sorted set request id → Redis ms until which the lock is pending
-- KEYS[7] records    hash request id → "<category>|<user>|<locked ms>|<seats>|<key>",
--                    and "k:<user>:<key>" → request id while that lock is pending
-- ARGV[1] category id   ARGV[2] user id   ARGV[3] quantity   ARGV[4] request id
-- ARGV[5] Idempotency-Key   ARGV[6] now, ms since the epoch (the sale window's clock)
-- ARGV[7] "auto" or "pick"  ARGV[8] seat columns per row   ARGV[9] pending for, ms
-- ARGV[10..] chosen seats "row:col" (mode "pick"), distinct
--
-- Returns {code, seats "r:c,r:c", Redis ms of the lock} (mirrored by SeatLockCode in
-- core/src/admission/seat_lock.rs):
--    1 LOCKED            the seats are pending for this request (now, or before)
--   -1 NOT_LOADED        the event is not in Redis
--   -2 NOT_OPEN          closed, or outside the sale window
--   -3 SOLD_OUT          fewer seats left than asked for
--   -5 SEAT_TAKEN        a chosen seat is not free, or no free seats to pick
--   -6 UNKNOWN_CATEGORY  no stock entry for the category
--   -7 UNKNOWN_SEAT      a chosen seat is not in the category
--  -11 IN_FLIGHT         another request with this Idempotency-Key holds a pending lock
local rcall = redis.call
local cid, user, qty, rid = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4]
local key, now, mode, cols = ARGV[5], tonumber(ARGV[6]), ARGV[7], tonumber(ARGV[8])
local chosen = {}
for i = 10, #ARGV do chosen[#chosen + 1] = ARGV[i] end

local before = rcall('HGET', KEYS[7], rid)
if before then
  local _, _, at_before, seats_before = string.match(before, '^([^|]*)|([^|]*)|([^|]*)|([^|]*)|')
  return {1, seats_before, tonumber(at_before)}
end
local marker = 'k:' .. user .. ':' .. key
if rcall('HEXISTS', KEYS[7], marker) == 1 then return {-11, '', 0} end

local meta = rcall('HMGET', KEYS[1], 'status', 'sale_start_ms', 'sale_end_ms')
if not meta[1] then return {-1, '', 0} end
if meta[1] ~= 'open' or now < tonumber(meta[2]) or now >= tonumber(meta[3]) then
  return {-2, '', 0}
end
local stock = rcall('HGET', KEYS[2], cid)
if not stock then return {-6, '', 0} end
if tonumber(stock) < qty then return {-3, '', 0} end
local seats, refused = pick_seats(KEYS[4], KEYS[5], mode, qty, cols, chosen)
if refused == -7 then return {-7, '', 0} end
if not seats then return {-5, '', 0} end

local t = rcall('TIME')
local at = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local pending = 'P:' .. rid
for _, seat in ipairs(seats) do
  rcall('HSET', KEYS[4], seat, pending)
  rcall('HINCRBY', KEYS[5], string.match(seat, '^(%d+):'), -1)
end
rcall('HINCRBY', KEYS[2], cid, -qty)
local seat_list = table.concat(seats, ',')
rcall('ZADD', KEYS[6], at + tonumber(ARGV[9]), rid)
rcall('HSET', KEYS[7], rid, cid .. '|' .. user .. '|' .. at .. '|' .. seat_list .. '|' .. key,
  marker, rid)
return {1, seat_list, at}
