-- The waiting room at the edge (docs/waiting-room.md): GET /api/events/{id}/queue answered
-- from the snapshot, and the Queue-Pass a purchase needs, checked with no Redis call.
--
-- state.lua's leader reads each room's settings and state (served, rate, the releases of
-- the last pass lifetime) with the rest of the snapshot, and `load` copies who is in
-- line into the shared dict, a chunk per tick: before the draw who joined (position
-- unknown), after it every position in order. A poll then costs one dict lookup (and
-- an HMAC for a buyer whose turn it is, kept per worker); a buyer the edge does not know
-- yet (joined a moment ago, or not at all) is asked of the core, which reads Redis.
-- The rules are room::status's in the core, the same answers from either.
local ngx = ngx
local cjson = require "cjson.safe"
local auth = require "stampede.auth"
local layout = require "stampede.keys"
local lrucache = require "resty.lrucache"
local reject = require("stampede.respond").reject
local floor, ceil, format, tonumber, match, sub = math.floor, math.ceil, string.format, tonumber, string.match, string.sub

local _M = {}

local dict        -- "<event>:<gen>:<user>" → position (0: joined before the open, not drawn)
local passes      -- per worker: "<event>:<user>:<id>:<expires>" → signed pass
local CHUNK = 20000 -- entries copied per room per tick
local null = cjson.null

-- opts: {dict}
function _M.init(opts)
  dict = assert(ngx.shared[opts.dict], "lua_shared_dict " .. tostring(opts.dict) .. " is not declared")
  passes = assert(lrucache.new(50000))
end

local ROOM_FIELDS = { "enabled", "require_pass", "ttl_ms", "drawn", "served", "rate_now", "gen" }

-- The command that reads an event's room settings for the snapshot.
function _M.settings_cmd(prefix, id)
  return { "hmget", prefix .. format(layout.room, id), unpack(ROOM_FIELDS) }
end

-- The room of the snapshot from its settings' reply, or nil when it has none.
function _M.from_reply(reply)
  if type(reply) ~= "table" then return nil end
  local enabled, require_pass = reply[1] == "1", reply[2] == "1"
  if not enabled and not require_pass then return nil end
  return {
    enabled = enabled, require_pass = require_pass, ttl_ms = tonumber(reply[3]) or 0,
    drawn = reply[4] == "1", served = tonumber(reply[5]) or 0, rate = tonumber(reply[6]) or 0,
    gen = type(reply[7]) == "string" and reply[7] or "", steps = {},
  }
end

local function progress_key(id, room, what) return "L:" .. id .. ":" .. room.gen .. ":" .. what end

-- Set once a place of the room could not be copied (a full dict): from then on a 0 after
-- the draw is the core's to answer. Forcible (it may evict another entry, whose owner
-- the core then answers): without it, a 0 would read "waiting" through its turn.
local function skipped_key(id, room) return "K:" .. id .. ":" .. room.gen end
local function skipped(id, room, keep)
  if not dict:get(skipped_key(id, room)) then
    dict:set(skipped_key(id, room), true, keep)
    ngx.log(ngx.WARN, "waiting room ", id, ": the edge's dict is full; the core answers the places it could not copy")
  end
end

-- The leader's further reads for a room: its releases, and the next chunk of who is in
-- line. Appends commands to cmds; returns a function that takes their replies. What it
-- copies is kept until a little after the sale's end (then its room is closed anyway).
function _M.more_cmds(prefix, id, room, cmds, now_ms, end_ms)
  if not room.enabled then return function() end end
  local first = #cmds + 1
  cmds[#cmds + 1] = { "zrangebyscore", prefix .. format(layout.room_steps, id), "(" .. (now_ms - room.ttl_ms - 5000), "+inf" }
  local which = room.drawn and "p" or "e"
  local pkey = progress_key(id, room, which)
  local from = dict:get(pkey) or 0
  local key = room.drawn and layout.room_positions or layout.room_early
  cmds[#cmds + 1] = { "zrangebyscore", prefix .. format(key, id), "(" .. from, "+inf", "WITHSCORES", "LIMIT", 0, CHUNK }
  return function(replies)
    local steps = replies[first]
    if type(steps) == "table" then
      for _, s in ipairs(steps) do
        local f, u, at = match(s, "^(%d+):(%d+):(%d+)$")
        if f then room.steps[#room.steps + 1] = { tonumber(f), tonumber(u), tonumber(at) } end
      end
    end
    local line = replies[first + 1]
    if type(line) ~= "table" then return end
    local last = from
    local base = id .. ":" .. room.gen .. ":"
    local keep = math.max(60, (end_ms - now_ms) / 1000 + room.ttl_ms / 1000 + 60)
    for i = 1, #line, 2 do
      local score = tonumber(line[i + 1])
      local ok, err
      if room.drawn then
        ok, err = dict:safe_set(base .. line[i], score, keep)
      else
        ok, err = dict:safe_add(base .. line[i], 0, keep)
      end
      -- A full dict: this one is not copied and the copy goes on, so the ones after it
      -- that are in the dict already (joined early: 0) get their positions; the room is
      -- marked, and from then on a 0 after the draw is the core's to answer (it stopped
      -- here before, for good, and every later early joiner stayed 0 and was told
      -- "waiting" through their turn: review).
      if not ok and err == "no memory" then skipped(id, room, keep) end
      last = score
    end
    if last ~= from and not dict:safe_set(pkey, last, keep) then skipped(id, room, keep) end
  end
end

-- A pass for this buyer's turn: "<kid>.q.<event>.<user>.<id>.<expires_ms>.<sig>".
local function pass_for(event_id, uid, id, expires_ms)
  local k = event_id .. ":" .. uid .. ":" .. id .. ":" .. expires_ms
  local p = passes:get(k)
  if not p then
    p = auth.sign("q." .. event_id .. "." .. uid .. "." .. id .. "." .. expires_ms)
    passes:set(k, p, (expires_ms / 1000) - ngx.now())
  end
  return p
end

-- The answer for a buyer at `pos` (0: joined, not drawn), as room::status computes it.
local function status(ev, room, event_id, uid, pos, now_ms)
  if not ev.open or now_ms >= ev.end_ms then
    return { state = "closed", position = null, ahead = null, eta_s = null }
  end
  if ev.all_sold then
    return { state = "sold_out", position = null, ahead = null, eta_s = null }
  end
  if pos == 0 then
    return { state = "waiting", position = null, ahead = null, eta_s = null }
  end
  if pos <= room.served then
    for _, s in ipairs(room.steps) do
      if s[1] < pos and pos <= s[2] then
        local expires = s[3] + room.ttl_ms
        if expires > now_ms then
          return { state = "your_turn", position = pos, ahead = 0, eta_s = 0,
            pass = pass_for(event_id, uid, pos, expires), pass_expires_ms = expires }
        end
        break
      end
    end
    return { state = "expired", position = pos, ahead = null, eta_s = null }
  end
  local ahead = pos - room.served - 1
  return { state = "waiting", position = pos, ahead = ahead,
    eta_s = room.rate > 0 and ceil((ahead + 1) / room.rate) or null }
end

local function answer(body, source)
  ngx.status = 200
  ngx.header["Content-Type"] = "application/json"
  ngx.header["X-Queue-Source"] = source
  ngx.header["Content-Length"] = #body
  ngx.print(body)
  return ngx.exit(200)
end

-- The content phase of /api/events/{id}/queue (after access.queue()): a GET the edge can
-- answer is answered here; anything else goes to the core. A buyer the core said is not
-- in line is told so here for NOT_IN_LINE_S (so polling without joining costs Redis
-- nothing more), until that buyer joins through this edge.
local NOT_IN_LINE_S = 1

function _M.serve(state)
  local event_id, uid = ngx.var.stampede_event, ngx.var.stampede_user
  local ev, room = state.room(event_id)
  local key = room and room.enabled and (event_id .. ":" .. room.gen .. ":" .. uid)
  if ngx.req.get_method() ~= "GET" then
    if key then dict:delete("N:" .. key) end
    return ngx.exec("/_core" .. ngx.var.uri)
  end
  if not key then return ngx.exec("/_core" .. ngx.var.uri) end
  local pos = dict:get(key)
  -- 0 is "joined, not drawn". After the draw it is a position the copy has not written
  -- yet — "waiting" until it does, seconds at most — or never, when the dict was full
  -- (the room marked): then only the core knows it.
  if pos and not (pos == 0 and room.drawn and dict:get(skipped_key(event_id, room))) then
    local now_ms = floor(ngx.now() * 1000)
    return answer(cjson.encode(status(ev, room, event_id, uid, pos, now_ms)), "edge")
  end
  if dict:get("N:" .. key) then
    return reject(404, "NOT_FOUND", "you are not in the waiting room of this event")
  end
  local res = ngx.location.capture("/_core" .. ngx.var.uri)
  if res.status == 404 then dict:safe_set("N:" .. key, true, NOT_IN_LINE_S) end
  if res.status >= 500 and (not res.body or res.body == "") then
    return ngx.exit(res.status) -- nginx's own error page (core down)
  end
  ngx.status = res.status
  ngx.header["Content-Type"] = "application/json"
  ngx.header["Content-Length"] = #(res.body or "")
  if res.header["Retry-After"] then ngx.header["Retry-After"] = res.header["Retry-After"] end
  ngx.print(res.body or "")
  return ngx.exit(res.status)
end

-- What is wrong with the request's Queue-Pass for this buyer and room, or nil.
local function pass_problem(event_id, uid, room)
  local text = ngx.var.http_queue_pass
  if not text then
    return "this sale admits buyers through its waiting room: join it, and buy with your pass in the Queue-Pass header when it is your turn"
  end
  local claims = auth.verify_signed(text)
  local ev, user, id, expires = match(claims or "", "^q%.(%d+)%.(%d+)%.(h?%d+)%.(%d+)$")
  -- A room's passes are positions, the hidden path's "h<n>": each good in its mode only.
  if not ev or (sub(id, 1, 1) == "h") == room.enabled then
    return "the queue pass is malformed or its signature is wrong"
  end
  if ev ~= event_id then return "the queue pass is for another event" end
  if user ~= uid then return "the queue pass is another buyer's" end
  if tonumber(expires) <= floor(ngx.now() * 1000) then return "the queue pass has expired" end
  return nil
end

-- Why a purchase of this event is refused for its pass (the code and the message), or
-- nil: with the room on (or the hidden path) the Queue-Pass must be signed, this event's
-- and user's, and not expired. Whether it was used already is the core's to say. Past
-- the sale's end (the moment state.gate still lets purchases on, until every key the sale
-- admitted is known here) such a purchase hears NOT_OPEN, never "join the line" for a
-- sale that is over; one with a good pass goes on to the core as a retry would.
function _M.pass_refusal(state, event_id, uid)
  local ev, room = state.room(event_id)
  if not room then return nil end
  local why = pass_problem(event_id, uid, room)
  if not why then return nil end
  if floor(ngx.now() * 1000) >= ev.end_ms then return "NOT_OPEN", "the sale is not open" end
  return "QUEUE_REQUIRED", why
end

return _M
