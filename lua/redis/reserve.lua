-- reserve.lua: admit one purchase, atomically, in one round trip (DESIGN.md "Admission").
-- Checks the idempotency key, the sale window, the per-user limit and the stock; takes
-- the units (and seats), records the buyer and the request status, queues the
-- reservation for the order workers, and flags the category sold out at 0.
--
-- The keys are one bucket's (docs/scaling.md): an event of one bucket has all its keys
-- under {ev:<id>}; with more, the buyer's bucket, whose stock the core refills.
--
-- KEYS[1] meta     hash   status, sale_start_ms, sale_end_ms, per_user_limit, epoch,
--                         buckets (B, absent = 1), seq (the admissions' number: grows by
--                         B with each, so bucket k's are ≡ k mod B; a rebuild sets it
--                         from MySQL's largest stock_log.seq of the bucket)
-- KEYS[2] stock    hash   category id → units available (a train class: seat-segments)
-- KEYS[3] soldout  hash   category id → 1 once stock reached 0 (with one bucket the
--                         edge's flag; with more, the bucket's own)
-- KEYS[4] held     hash   user id → units the user holds in this event
-- KEYS[5] idem     hash   "<user>:<key>" → "<request id>|<fingerprint>|<seats>"
-- KEYS[6] status   hash   user id → "QUEUED:<request id>"; and "r:<user>:<request
--                         id>" → the status of a purchase this one replaces as the
--                         buyer's latest while it is undecided or failed ("QUEUED:…",
--                         "FAILED:<id>:<reason>"), for the status asked for by request
--                         id (of one that is an order already, MySQL tells)
-- KEYS[7] stream   stream reservations for the order workers, one field each: "v1" =
--                         "<request id>|<user>|<category>|<quantity>|<seats r:c,…>|
--                         <now ms>|<epoch>|<seq>|<journey from:to, or empty>"
-- KEYS[8] seats    hash   "row:col" → "F" free, "L:<request id>" locked (seated mode)
-- KEYS[9] rowfree  hash   row → free seats in it (seated mode)
-- For a journey (a train's class, mode "segments:…") KEYS[8] is the class's segments
-- hash (lib/segments.lua) and KEYS[9] its version hash (category id → changes), and
-- KEYS[3] takes "<category>:<from>:<to>" → 1 once no seat at all is free on that
-- journey (the edge reads them as journey flags, apart from the category flags).
-- For an unseated category the core passes no KEYS[8] and KEYS[9]; for seats locked
-- elsewhere it passes the bucket's stock key for both. Neither is touched then. Every
-- key carries the bucket's hash tag.
--
-- ARGV[1] category id      ARGV[2] user id       ARGV[3] quantity
-- ARGV[4] request id (the order number)          ARGV[5] Idempotency-Key
-- ARGV[6] now, ms since the epoch
-- ARGV[7] seat mode: "none" (unseated), "auto" (best ARGV[3] seats), "pick" (ARGV[10..]),
--         or "segments:<from>:<to>" (a train journey, stations 0-based; ARGV[10..] the
--         chosen "<carriage>:<seat>", else the best),
--         or "locked-auto" / "locked-pick": the seats ARGV[10..] are already locked in
--         the seats' own slot (an event of several buckets: seat_lock.lua); nothing
--         here touches seats or the category's stock
-- ARGV[8] seat columns per row ("auto", "pick"); the lock's Redis time in ms
--         ("locked-…"); else "0"
-- ARGV[9] most reservations the stream may hold before admission pauses
-- ARGV[10..] chosen seats "row:col" (mode "pick"), distinct; the locked seats
--
-- Returns {code, request id, seats "r:c,r:c"} (mirrored by ReserveCode in
-- core/src/admission/reserve.rs):
--    1 QUEUED            reserved now
--    2 REPLAYED          same key, same request before: its request id and seats
--   -1 NOT_LOADED        the event is not in Redis (not published)
--   -2 NOT_OPEN          closed, or outside the sale window
--   -3 SOLD_OUT          fewer units left than asked for (a journey: fewer seats free
--                        on every segment of it)
--   -4 LIMIT_REACHED     the user would hold more than per_user_limit
--   -5 SEAT_TAKEN        a chosen seat is not free, or no free seats to pick
--   -6 UNKNOWN_CATEGORY  no stock entry for the category
--   -7 UNKNOWN_SEAT      a chosen seat is not in the category
--   -8 KEY_REUSED        the Idempotency-Key was used for a different request
--   -9 SALE_BUSY         the order workers are this far behind: try again shortly
--                        (or the seats' lock is older than 10 s)
--  -10 REFILL            (B > 1) the bucket has fewer units than asked for: the core
--                        moves units into it, or finds the category sold out
local rcall = redis.call
local tonumber, concat = tonumber, table.concat

local cid, user, qty = ARGV[1], ARGV[2], tonumber(ARGV[3])
local rid, key, now = ARGV[4], ARGV[5], tonumber(ARGV[6])
local mode, cols, max_depth = ARGV[7], tonumber(ARGV[8]), tonumber(ARGV[9])
local chosen = {}
for i = 10, #ARGV do chosen[#chosen + 1] = ARGV[i] end
-- "locked-auto" / "locked-pick": the seats were locked in their own slot; the request
-- is still the "auto" / "pick" one it was, for its fingerprint.
local locked_at = nil
local locked = string.sub(mode, 1, 7) == 'locked-'
if locked then
  mode = string.sub(mode, 8)
  locked_at = cols
end
-- "segments:<from>:<to>": a train's journey from station <from> to <to> (lib/segments.lua;
-- ARGV[10..] chosen seats "<carriage>:<seat>", else the best); the mode is in the
-- fingerprint, so a repeated key must ask for the same journey.
local from_st, to_st = string.match(mode, '^segments:(%d+):(%d+)$')
local journey = from_st ~= nil
if journey then from_st, to_st = tonumber(from_st), tonumber(to_st) end
local asked = (locked and mode == 'auto') and '' or concat(chosen, ',')
-- Numbers handed back to Redis or joined into text are passed as the strings they came
-- in (ARGV[3], ARGV[6], meta's buckets) or formatted with %d: Lua's default formatting
-- of a number goes through the C library's floating-point printing, a measurable share
-- of Redis's time per admission.
local qty_s, now_s = ARGV[3], ARGV[6]
local fingerprint = cid .. ':' .. qty_s .. ':' .. mode .. ':' .. asked

-- 1. A repeated key answers what it answered the first time.
local idem_field = user .. ':' .. key
local seen = rcall('HGET', KEYS[5], idem_field)
if seen then
  local first_rid, first_fp, first_seats = string.match(seen, '^([^|]*)|([^|]*)|(.*)$')
  if first_fp ~= fingerprint then return {-8, first_rid, ''} end
  return {2, first_rid, first_seats}
end

-- 2. The sale must be open now.
local meta = rcall('HMGET', KEYS[1], 'status', 'sale_start_ms', 'sale_end_ms', 'per_user_limit', 'epoch', 'buckets')
if not meta[1] then return {-1, '', ''} end
if meta[1] ~= 'open' or now < tonumber(meta[2]) or now >= tonumber(meta[3]) then
  return {-2, '', ''}
end

-- 3. Promise only what the order workers can keep up with.
if rcall('XLEN', KEYS[7]) >= max_depth then return {-9, '', ''} end

-- 4. Stock, then the user's limit across everything held in this event. Seats locked
-- elsewhere were counted there; a lock older than 10 s by this master's clock is not
-- trusted (the sweeper frees pending locks after 30 s).
if locked then
  local t = rcall('TIME')
  if tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) - locked_at > 10000 then
    return {-9, '', ''}
  end
end
-- A journey's units are seat-segments: seats × segments of the journey.
local units = journey and qty * (to_st - from_st) or qty
local stock = locked and qty_s or rcall('HGET', KEYS[2], cid)
if not stock then return {-6, '', ''} end
if journey and tonumber(stock) < units then
  -- Fewer free seat-segments than one seat needs: no seat is free on the journey.
  if tonumber(stock) < to_st - from_st then
    rcall('HSET', KEYS[3], cid .. ':' .. from_st .. ':' .. to_st, 1)
  end
  return {-3, '', ''}
end
local buckets_s = meta[6] or '1'
local buckets = tonumber(buckets_s)
local held = tonumber(rcall('HGET', KEYS[4], user) or '0')
if not journey and tonumber(stock) < qty then
  -- A buyer at their limit is told so before the core moves units for them.
  if buckets > 1 then
    if held + qty > tonumber(meta[4]) then return {-4, '', ''} end
    return {-10, '', ''}
  end
  return {-3, '', ''}
end
if held + qty > tonumber(meta[4]) then return {-4, '', ''} end

-- 5. Seats: the chosen ones if all free, or the best free ones (lib/seat_pick.lua,
-- loaded in front of this script). With seats in another slot (mode "locked") seat_lock.lua
-- took them before: ARGV[10..] are the seats it locked.
local seats = {}
if locked then
  seats = chosen
elseif journey then
  local refused, free
  seats, refused, free = seg_pick(KEYS[8], from_st, to_st, qty, chosen)
  if refused == -3 then
    -- Proven: no seat free on this journey until something is given back.
    if free == 0 then rcall('HSET', KEYS[3], cid .. ':' .. from_st .. ':' .. to_st, 1) end
    return {-3, '', ''}
  end
  if refused == -7 then return {-7, '', ''} end
  if not seats then return {-5, '', ''} end
elseif mode == 'pick' or mode == 'auto' then
  local refused
  seats, refused = pick_seats(KEYS[8], KEYS[9], mode, qty, cols, chosen)
  if refused == -7 then return {-7, '', ''} end
  if not seats then return {-5, '', ''} end
end

-- 6. Everything checked: take it.
local seat_list = concat(seats, ',')
if journey then
  seg_set(KEYS[8], seats, from_st, to_st, '1')
  rcall('HINCRBY', KEYS[9], cid, 1)
  if rcall('HINCRBY', KEYS[2], cid, -units) == 0 then rcall('HSET', KEYS[3], cid, 1) end
elseif not locked then
  local lock = 'L:' .. rid
  for _, seat in ipairs(seats) do
    rcall('HSET', KEYS[8], seat, lock)
    rcall('HINCRBY', KEYS[9], string.match(seat, '^(%d+):'), -1)
  end
  if rcall('HINCRBY', KEYS[2], cid, '-' .. qty_s) == 0 then rcall('HSET', KEYS[3], cid, '1') end
end
rcall('HINCRBY', KEYS[4], user, qty_s)
rcall('HSET', KEYS[5], idem_field, rid .. '|' .. fingerprint .. '|' .. seat_list)
-- The purchase this one replaces as the buyer's latest keeps its status under its own
-- number while it is undecided or failed (an order, MySQL tells).
local prior = rcall('HGET', KEYS[6], user)
local was = prior and (string.match(prior, '^QUEUED:(%d+)$') or string.match(prior, '^FAILED:(%d+):'))
if was and was ~= rid then rcall('HSET', KEYS[6], 'r:' .. user .. ':' .. was, prior) end
rcall('HSET', KEYS[6], user, 'QUEUED:' .. rid)
local seq = string.format('%d', rcall('HINCRBY', KEYS[1], 'seq', buckets_s))
-- One field, "v1": the reservation's values joined by "|" (Reservation::from_entry in
-- core/src/orders/reservation.rs). One field instead of eight: the workers and the
-- reconciler decode 5 RESP values per reservation where they decoded 19, and Redis
-- writes and replies fewer.
local journey_s = journey and (from_st .. ':' .. to_st) or ''
rcall('XADD', KEYS[7], '*', 'v1',
  concat({ rid, user, cid, qty_s, seat_list, now_s, meta[5] or '0', seq, journey_s }, '|'))
return {1, rid, seat_list}
