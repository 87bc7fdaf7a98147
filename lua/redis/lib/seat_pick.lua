-- lib/seat_pick.lua: the seat choice reserve.lua and seat_lock.lua share. Not a script of its
-- own: the core puts it in front of each of them when it loads them
-- (core/src/admission/reserve.rs), so both choose seats the same way.
--
-- pick_seats(seats, rowfree, mode, n, cols, chosen) → the seats "row:col" to take, or
-- nil and a refusal code: -5 SEAT_TAKEN (a chosen seat is not free, or no n free seats)
-- or -7 UNKNOWN_SEAT (a chosen seat is not in the category). Only state 'F' is free.
--   seats    hash "row:col" → state        rowfree  hash row → free seats in it
--   mode     "pick" (the chosen seats) or "auto" (the best n)
local function pick_seats(seats, rowfree, mode, n, cols, chosen)
  local rcall, unpack = redis.call, unpack
  if mode == 'pick' then
    local states = rcall('HMGET', seats, unpack(chosen))
    for i = 1, #chosen do
      if not states[i] then return nil, -7 end
      if states[i] ~= 'F' then return nil, -5 end
    end
    return chosen
  end

  local function row_seats(row)
    local names = {}
    for c = 1, cols do names[c] = row .. ':' .. c end
    return names, rcall('HMGET', seats, unpack(names))
  end

  -- Adjacent seats in the lowest row that has them, else the first free seats in row
  -- order (the fewest rows). Reads only rows with enough free seats, never the whole map.
  local counts = rcall('HGETALL', rowfree)
  local rows = {}
  for i = 1, #counts, 2 do
    local free = tonumber(counts[i + 1])
    if free > 0 then rows[#rows + 1] = {tonumber(counts[i]), free} end
  end
  table.sort(rows, function(a, b) return a[1] < b[1] end)
  for _, r in ipairs(rows) do
    if r[2] >= n then
      local names, states = row_seats(r[1])
      local run = 0
      for c = 1, cols do
        if states[c] == 'F' then
          run = run + 1
          if run == n then return {unpack(names, c - n + 1, c)} end
        else
          run = 0
        end
      end
    end
  end
  local taken = {}
  for _, r in ipairs(rows) do
    local names, states = row_seats(r[1])
    for c = 1, cols do
      if states[c] == 'F' then
        taken[#taken + 1] = names[c]
        if #taken == n then return taken end
      end
    end
  end
  return nil, -5
end

