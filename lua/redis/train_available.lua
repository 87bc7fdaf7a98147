-- train_available.lua: seats free on every segment of a journey, per class, counted from
-- the seats themselves (lib/segments.lua, loaded in front), never from a counter.
--
-- KEYS[1..n] the classes' segments hashes   KEYS[n+1] their version hash
-- ARGV[1] from station   ARGV[2] to station (0-based, from < to)
-- ARGV[3..n+2] the classes' category ids, in the order of KEYS
--
-- Returns (mirrored by Available in core/src/trains.rs) a flat list: per class, seats
-- free on the journey and the class's version (changes to its seats so far), so a
-- cache keyed by the version is exact.
local rcall = redis.call
local f, t = tonumber(ARGV[1]), tonumber(ARGV[2])
local n = #KEYS - 1
local out = {}
for i = 1, n do
  local all = rcall('HGETALL', KEYS[i])
  local free = 0
  for k = 2, #all, 2 do
    if seg_free(all[k], f, t) then free = free + 1 end
  end
  out[#out + 1] = free
  out[#out + 1] = tonumber(rcall('HGET', KEYS[n + 1], ARGV[i + 2]) or '0')
end
return out
