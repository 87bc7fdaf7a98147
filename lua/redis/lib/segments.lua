-- lib/segments.lua: seats sold by route segment (trains, docs/trains.md). Not a script of
-- its own: the core puts it in front of the scripts that take, give back and count
-- segments (core/src/trains.rs), so they all read one layout the same way.
--
-- A class's seats are one hash, "<carriage>:<seat>" → a string of one character per
-- segment of the route ('1' taken, '0' free): segment k (1-based) runs from station k-1
-- to station k (0-based stations). A journey from station f to station t (f < t) uses
-- segments f+1 … t. Availability is counted from these strings, never kept apart.

-- True when the seat's segments f+1 … t are all free.
local function seg_free(occupied, f, t)
  return not string.find(string.sub(occupied, f + 1, t), '1', 1, true)
end

-- The seat's string with segments f+1 … t set to `mark` ('1' or '0').
local function seg_mark(occupied, f, t, mark)
  return string.sub(occupied, 1, f) .. string.rep(mark, t - f) .. string.sub(occupied, t + 1)
end

-- How well a free seat suits f → t (higher first): a journey that ends a taken
-- stretch or starts one leaves no gap too short to sell; a seat already sold on some
-- segment is taken before a seat still free on the whole route, which is kept for a
-- long journey.
local function seg_fit(occupied, f, t)
  local fit = 0
  if f > 0 and string.sub(occupied, f, f) == '1' then fit = fit + 2 end
  if t < #occupied and string.sub(occupied, t + 1, t + 1) == '1' then fit = fit + 2 end
  if string.find(occupied, '1', 1, true) then fit = fit + 1 end
  return fit
end

-- The seats of hash `seats` to take for n passengers from f to t, or nil and a refusal:
-- -3 SOLD_OUT (fewer than n seats free on the whole journey; then also how many are),
-- -5 SEAT_TAKEN (a chosen
-- seat is not free on it), -7 UNKNOWN_SEAT (a chosen seat is not in the class).
-- `chosen` (a list of "<carriage>:<seat>") takes exactly those; else the best n: for a
-- group, n seats next to each other in one carriage when some are (the best fitting
-- such run), else the n best fitting seats; ties go to the lowest carriage and seat.
local function seg_pick(seats, f, t, n, chosen)
  local rcall = redis.call
  if #chosen > 0 then
    local states = rcall('HMGET', seats, unpack(chosen))
    for i = 1, #chosen do
      if not states[i] then return nil, -7 end
      if not seg_free(states[i], f, t) then return nil, -5 end
    end
    return chosen
  end
  local all = rcall('HGETALL', seats)
  local free = {}
  for i = 1, #all, 2 do
    if seg_free(all[i + 1], f, t) then
      local car, num = string.match(all[i], '^(%d+):(%d+)$')
      free[#free + 1] = {name = all[i], car = tonumber(car), num = tonumber(num),
        fit = seg_fit(all[i + 1], f, t)}
    end
  end
  if #free < n then return nil, -3, #free end
  table.sort(free, function(a, b)
    if a.car ~= b.car then return a.car < b.car end
    return a.num < b.num
  end)
  if n > 1 then
    local best, best_fit = nil, -1
    for i = 1, #free - n + 1 do
      local last = free[i + n - 1]
      if last.car == free[i].car and last.num - free[i].num == n - 1 then
        local fit = 0
        for k = i, i + n - 1 do fit = fit + free[k].fit end
        if fit > best_fit then best, best_fit = i, fit end
      end
    end
    if best then
      local run = {}
      for k = best, best + n - 1 do run[#run + 1] = free[k].name end
      return run
    end
  end
  -- The n best fitting: a stable choice by fit, then position.
  for i, s in ipairs(free) do s.pos = i end
  table.sort(free, function(a, b)
    if a.fit ~= b.fit then return a.fit > b.fit end
    return a.pos < b.pos
  end)
  local taken = {}
  for k = 1, n do taken[k] = free[k].name end
  return taken
end

-- Marks the seats' segments f+1 … t with `mark` ('1' take, '0' give back); only seats
-- whose segments are all the other way change (a repeat changes nothing). Returns the
-- number of seats changed.
local function seg_set(seats, list, f, t, mark)
  local rcall = redis.call
  local changed = 0
  for _, seat in ipairs(list) do
    local occupied = rcall('HGET', seats, seat)
    local span = occupied and string.sub(occupied, f + 1, t)
    if span and #span == t - f and not string.find(span, mark, 1, true) then
      rcall('HSET', seats, seat, seg_mark(occupied, f, t, mark))
      changed = changed + 1
    end
  end
  return changed
end

-- After seats of class `cid` were given back: the class's "no seat on this journey"
-- flags (fields "<cid>:<from>:<to>" of hash `soldout`) no longer hold.
local function seg_reopen(soldout, cid)
  local rcall = redis.call
  local prefix = cid .. ':'
  for _, field in ipairs(rcall('HKEYS', soldout)) do
    if string.sub(field, 1, #prefix) == prefix then rcall('HDEL', soldout, field) end
  end
end


-- Gives back the seats of a purchase (release.lua, restock.lua): a train journey's
-- segments ("<from>:<to>" in `journey`; `aux` is then the class's version hash) or, for
-- a concert's seats, those still held `lock` ("L:<id>") back to free (`aux`: the row
-- counts of free seats). `list` is "r:c,r:c" (or ""). Returns, for a journey, the
-- seat-segments it gave back (none for seats whose segments were not all taken: a
-- repeat, or a seat a heal or a rebuild freed already), else nil.
local function seats_give_back(seats, aux, soldout, cid, list, journey, lock)
  local rcall = redis.call
  local from_st, to_st = string.match(journey, '^(%d+):(%d+)$')
  if from_st then
    local taken = {}
    for seat in string.gmatch(list, '[^,]+') do taken[#taken + 1] = seat end
    local f, t = tonumber(from_st), tonumber(to_st)
    local changed = seg_set(seats, taken, f, t, '0')
    rcall('HINCRBY', aux, cid, 1)
    seg_reopen(soldout, cid)
    return changed * (t - f)
  end
  for seat in string.gmatch(list, '[^,]+') do
    if rcall('HGET', seats, seat) == lock then
      rcall('HSET', seats, seat, 'F')
      rcall('HINCRBY', aux, string.match(seat, '^(%d+):'), 1)
    end
  end
end
