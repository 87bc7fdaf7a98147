-- A train's availability by journey, GET /api/events/{id}/availability?from=&to=, answered
-- by the edge from a shared cache, the core asked only when the train's seats changed.
--
-- The core counts free seats from the seats themselves (train_available.lua: a read of
-- every seat of every class). Each answer is kept with the train's seat stamp (its
-- classes' versions, state.lua) from the snapshot in force when it was asked for; the
-- count is at least that new. While the snapshot's stamp is the same, no seat changed
-- and the kept answer is exact. Once it moved, one request per journey recounts (a lock
-- in the dict) while the others get the kept answer for at most `recount_s`: during a
-- hot sale the core counts each journey at most every `recount_s` per edge, whatever
-- the number of buyers looking. X-Cache says which: HIT, STALE or MISS.
local ngx = ngx
local state = require "stampede.state"
local floor, find, sub = math.floor, string.find, string.sub

local _M = {}

local dict, recount_s
local MAX_ARGS = 64 -- longer queries are never valid; they go to the core uncached

-- opts: {dict, recount_s}
function _M.init(opts)
  dict = assert(ngx.shared[opts.dict], "lua_shared_dict " .. tostring(opts.dict) .. " is not declared")
  recount_s = opts.recount_s
end

local function answer(status, body, cache)
  ngx.status = status
  ngx.header["Content-Type"] = "application/json"
  ngx.header["Content-Length"] = #body
  ngx.header["X-Cache"] = cache
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

-- The content phase (after access.api("GET")); the event id is in $stampede_event.
function _M.serve()
  local event_id, args = ngx.var.stampede_event, ngx.var.args or ""
  local stamp = state.seat_stamp(event_id)
  local key = event_id .. "?" .. args
  local cacheable = stamp ~= nil and #args <= MAX_ARGS
  local now_ms = floor(ngx.now() * 1000)
  if cacheable then
    local kept = dict:get(key)
    if kept then
      local kept_stamp, at_ms, body = unpack_entry(kept)
      if kept_stamp == stamp then return answer(200, body, "HIT") end
      -- Changed since: one request recounts; the rest keep the answer a little longer.
      if at_ms and now_ms - at_ms < recount_s * 1000 or not dict:add("lock:" .. key, true, 2) then
        return answer(200, body, "STALE")
      end
    end
  end
  local res = ngx.location.capture("/_core" .. ngx.var.uri, { args = args })
  if cacheable then
    if res.status == 200 then dict:set(key, stamp .. "\n" .. now_ms .. "\n" .. res.body) end
    dict:delete("lock:" .. key)
  end
  local status = res.status
  if status >= 500 and (not res.body or res.body == "") then
    return ngx.exit(status) -- nginx's own error page (core down)
  end
  return answer(status, res.body or "", "MISS")
end

return _M
