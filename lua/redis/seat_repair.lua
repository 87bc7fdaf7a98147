-- seat_repair.lua: the reconciler's heal for a train's class (lib/segments.lua in
-- front, docs/trains.md): sets seats' strings to what MySQL's live orders hold —
-- nothing at all if the class's version moved since the reconciler read them (a take
-- or a give-back came in between: the next pass looks again), and each seat only while
-- it is still the string read ("" for a seat missing) — then sets the class's stock to
-- the free seat-segments of all its seats, so the counter and the seats are one again.
--
-- KEYS[1] the class's segments hash   KEYS[2] stock   KEYS[3] soldout   KEYS[4] versions
-- ARGV[1] category id   ARGV[2] the class's version when its seats were read
-- ARGV[3..] per seat: "<carriage>:<seat>", measured string ("" missing), wanted string
--
-- Returns (mirrored by Repaired in core/src/reconcile/heal.rs) {seats changed, the
-- class's stock after}.
local rcall = redis.call
local cid = ARGV[1]

local function free_in(s)
  local _, n = string.gsub(s, '0', '')
  return n
end

local before = tonumber(rcall('HGET', KEYS[2], cid) or '0')
if (rcall('HGET', KEYS[4], cid) or '0') ~= ARGV[2] then return { 0, before } end
local changed = 0
for i = 3, #ARGV, 3 do
  local seat, measured, wanted = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  if (rcall('HGET', KEYS[1], seat) or '') == measured then
    rcall('HSET', KEYS[1], seat, wanted)
    changed = changed + 1
  end
end
local free = 0
for _, seat in ipairs(rcall('HVALS', KEYS[1])) do free = free + free_in(seat) end
if changed == 0 and free == before then return { 0, before } end
rcall('HINCRBY', KEYS[4], cid, 1)
rcall('HSET', KEYS[2], cid, free)
if free == 0 then
  rcall('HSET', KEYS[3], cid, 1)
elseif free > before or changed > 0 then
  rcall('HDEL', KEYS[3], cid)
  seg_reopen(KEYS[3], cid)
end
return { changed, free }
