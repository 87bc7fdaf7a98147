-- A train's availability by journey, GET /api/events/{id}/availability?from=&to=, answered
-- by the edge from a shared cache, the core asked only when the train's seats changed.
--
-- The core counts free seats from the seats themselves (train_available.lua: a read of
-- every seat of every class, on the Redis that admits purchases). Each answer is kept
-- with the train's seat stamp (its keys' generation and its classes' versions,
-- state.lua) from the snapshot in force when it was asked for; the count is at least
-- that new. While the snapshot's stamp is the same, no seat changed and the kept answer
-- is exact (HIT). Once it moved, one request per journey recounts (a lock in the dict)
-- while the others get the kept answer (STALE) — for at most `recount_s`, and while the
-- train's recounts this second are over `recounts_per_s` (the core then counts a train
-- at most that often per edge, however many journeys and buyers look). A journey never
-- asked before is counted once, the requests meanwhile waiting for that count (MISS);
-- that count takes from the same budget, and past it is 429 (nothing kept to answer).
-- While the snapshot is stale (the edge cannot read Redis), no kept answer is a HIT and
-- each journey is recounted as after a change.
--
-- The query must be the one spelling the core takes, `from=<n>&to=<n>`: anything else
-- is answered 400 here, so no other spelling makes another entry or reaches the core.
local ngx = ngx
local state = require "stampede.state"
local reject = require("stampede.respond").reject
local floor, find, sub, match = math.floor, string.find, string.sub, string.match

local _M = {}

local dict, recount_s, recounts_per_s, keep_s

-- opts: {dict, recount_s, recounts_per_s, keep_s}
function _M.init(opts)
  dict = assert(ngx.shared[opts.dict], "lua_shared_dict " .. tostring(opts.dict) .. " is not declared")
  recount_s, recounts_per_s, keep_s = opts.recount_s, opts.recounts_per_s, opts.keep_s
end

local function answer(status, body, cache, retry_after)
  ngx.status = status
  ngx.header["Content-Type"] = "application/json"
  ngx.header["Content-Length"] = #body
  ngx.header["X-Cache"] = cache
  if retry_after then ngx.header["Retry-After"] = retry_after end
  ngx.print(body)
  return ngx.exit(status)
end

-- A kept answer: stamp, time it was counted (ms), body.
local function unpack_entry(v)
  local a = find(v, "\n", 1, true)
  local b = a and find(v, "\n", a + 1, true)
  if not b then return nil end
  return sub(v, 1, a - 1), tonumber(sub(v, a + 1, b - 1)), sub(v, b + 1)
end

-- Whether the train may be recounted once more this second (on this edge).
local function within_budget(event_id, now_s)
  local n = dict:incr("budget:" .. event_id .. ":" .. now_s, 1, 0, 2)
  return n and n <= recounts_per_s
end

-- The content phase (after access.api("GET")); the event id is in $stampede_event.
function _M.serve()
  local event_id, args = ngx.var.stampede_event, ngx.var.args or ""
  local from, to = match(args, "^from=(%d%d?)&to=(%d%d?)$")
  if not from or (#from > 1 and sub(from, 1, 1) == "0") or (#to > 1 and sub(to, 1, 1) == "0") then
    return reject(400, "INVALID", "give ?from=<station>&to=<station>, in that order (station indexes along the route)")
  end
  local stamp, stale = state.seat_stamp(event_id)
  -- A stale snapshot says nothing of the seats: every kept answer counts as changed
  -- (recounted under the lock and the budget, STALE meanwhile), and a count made now is
  -- kept under a stamp no snapshot has. Each request asked the core for a full count
  -- while the edge could not read Redis (review).
  if stale then stamp = "" end
  local key = event_id .. "?" .. args
  local lock = "lock:" .. key
  local now = ngx.now()
  local now_ms = floor(now * 1000)
  local locked = false
  local kept_body -- the answer a failed recount falls back on
  if stamp then
    local kept = dict:get(key)
    if kept then
      local kept_stamp, at_ms, body = unpack_entry(kept)
      kept_body = body
      if kept_stamp == stamp and not stale then return answer(200, body, "HIT") end
      -- Changed since: one request recounts; the rest keep the answer a little longer.
      local young = at_ms and now_ms - at_ms < recount_s * 1000
      if young or not dict:add(lock, true, 2) then return answer(200, body, "STALE") end
      locked = true
      if not within_budget(event_id, floor(now)) then
        dict:delete(lock)
        return answer(200, body, "STALE")
      end
    elseif dict:add(lock, true, 2) then
      -- A first count takes from the train's budget too: a buyer's app asks a few
      -- journeys, but each of a long train's thousands of journeys asked once costs the
      -- core a count of every seat (review). Past it, nothing kept to answer: 429.
      if not within_budget(event_id, floor(now)) then
        dict:delete(lock)
        return reject(429, "RATE_LIMITED", "this train's availability is being counted for too many journeys at once; try again in a moment", 1)
      end
      locked = true
    else
      -- Someone is counting this journey for the first time: wait for that count.
      for _ = 1, 20 do
        ngx.sleep(0.025)
        kept = dict:get(key)
        if kept then
          local _, _, body = unpack_entry(kept)
          return answer(200, body, "MISS")
        end
      end
    end
  end
  local res = ngx.location.capture("/_core" .. ngx.var.uri, { args = args })
  if stamp and res.status == 200 then
    dict:set(key, stamp .. "\n" .. now_ms .. "\n" .. res.body, keep_s)
  end
  if locked then dict:delete(lock) end
  local status = res.status
  -- The core could not count (Redis out of reach, most likely, as the snapshot says):
  -- the last count, marked STALE, as every other request of the journey meanwhile.
  if status >= 500 and kept_body then return answer(200, kept_body, "STALE") end
  if status >= 500 and (not res.body or res.body == "") then
    return ngx.exit(status) -- nginx's own error page (core down)
  end
  return answer(status, res.body or "", "MISS", res.header["Retry-After"])
end

return _M
