-- The purchases a sale admitted, known to every edge once it refuses the sale whole.
--
-- A purchase whose Idempotency-Key an edge let through skips that edge's sale window and
-- sold-out flags (access.lua), so that its repeat reaches the core, which answers it as
-- it did the first time. Those keys are the edge's own: a buyer whose first request went
-- through another edge, or through this one before nginx restarted or more than
-- passed_ttl_s ago, was told SOLD_OUT or NOT_OPEN though admitted. So, for a listed sale
-- every purchase of which the edge now refuses (closed, past its end, every category
-- sold out), the refresh leader copies the sale's Idempotency-Key records — reserve.lua's
-- `<user>:<key>` fields, written for admitted purchases only — into the dict of keys let
-- through, as answered 202. Such a sale's records no longer grow: each bucket's record
-- hash is scanned again only when its length changed, or after half the dict's lifetime
-- (to keep the copies alive while the sale is listed), in pages of PAGE fields, for at
-- most budget_s a refresh. The per-request cost is unchanged: the refusal path already
-- looks its key up. Copying stops while less than a quarter of the dict is free, so the
-- copies never take the room of keys let through for sales still selling.
-- Not covered: a sale partly sold out (its records grow with every purchase), where a
-- repeat through another edge of a purchase of a sold-out category meets that edge's
-- flag; a sale no longer listed (retired after its end), whose copies lapse.
local ngx = ngx
local store = require "stampede.cluster"
local layout = require "stampede.keys" -- generated from core/src/keys.rs
local floor, format, match, tonumber = math.floor, string.format, string.match, tonumber

local _M = {}

_M.QUEUED = 2 -- access.lua's state of a key answered (maybe) 202

local PAGE = 1000
local SLOTS = 16384
local MAX_BUCKETS = 16 -- core/src/domain/event.rs's MAX_BUCKETS

local passed, progress, ttl_s, prefix, budget_s

-- opts: {passed_dict, passed_ttl_s, state_dict, prefix, budget_s}
function _M.init(opts)
  passed = assert(ngx.shared[opts.passed_dict], "lua_shared_dict " .. tostring(opts.passed_dict) .. " is not declared")
  progress = assert(ngx.shared[opts.state_dict], "lua_shared_dict " .. tostring(opts.state_dict) .. " is not declared")
  ttl_s, prefix, budget_s = opts.passed_ttl_s, opts.prefix, opts.budget_s
end

-- The hash tags of an event's buckets, as core/src/keys.rs's Bucket::tag makes them:
-- `ev:<id>` for an event of one bucket; else for bucket i of n the first
-- `ev:<id>:b<i>.<k>` (k = 0, 1, ...) whose slot falls in the i-th n-th of the slots.
local tags = {} -- "<event>/<count>" → {tag, ...}
local function bucket_tags(event_id, count)
  local known = tags[event_id .. "/" .. count]
  if known then return known end
  local list = {}
  if count <= 1 then
    list[1] = "ev:" .. event_id
  else
    for index = 0, count - 1 do
      local k = 0
      while true do
        local tag = "ev:" .. event_id .. ":b" .. index .. "." .. k
        if floor(store.slot(tag) * count / SLOTS) == index then
          list[#list + 1] = tag
          break
        end
        k = k + 1
      end
    end
  end
  tags[event_id .. "/" .. count] = list
  return list
end

-- Whether the edge refuses every purchase of `ev` (state.lua's snapshot entry) at `now_ms`
-- for a reason that lasts: closed, ended, or every category sold out. (A sale not open
-- yet has no records.)
local function refused_whole(ev, now_ms)
  return not ev.open or now_ms >= ev.end_ms or ev.all_sold
end

local warned = {} -- what → when last logged (s): one line a minute each
local function warn_now(what)
  local now = ngx.now()
  if (warned[what] or 0) + 60 > now then return false end
  warned[what] = now
  return true
end

-- Copies one page of `key`'s records of `event_id`; the next cursor ("0": done) and the
-- fields seen, or nil and an error (the dict refused a key: left for the next refresh).
local function copy_page(key, event_id, cursor)
  local replies, err = store.run({ { "hscan", key, cursor, "COUNT", PAGE } })
  if not replies then return nil, err end
  local reply = replies[1]
  local fields = reply[2]
  for i = 1, #fields, 2 do
    local user, k = match(fields[i], "^(%d+):(.+)$")
    if user then
      local ok, serr = passed:safe_set(user .. ":" .. event_id .. ":" .. k, _M.QUEUED, ttl_s)
      if not ok then return nil, "idempotency-key dict: " .. tostring(serr) end
    end
  end
  return reply[1], #fields / 2
end

-- The bucket count an event's meta gives (nil: not a count this edge can use). An event
-- loaded before the meta had it counts as one bucket: right for most, and for an event
-- of several nothing is copied until its next load (publish, reopen, rebuild).
local function bucket_count(ev)
  local n = ev.buckets or 1
  if n >= 1 and n <= MAX_BUCKETS and n == floor(n) then return n end
end

-- From the refresh leader, with a snapshot (state.lua's) before it is published: the
-- events it read from Redis this time (read_at), each with its bucket count. Stops
-- after budget_s, or when the dict has less than a quarter free; what was copied
-- stays, and the next refresh goes on where this one stopped.
function _M.sync(snap)
  ngx.update_time()
  local started = ngx.now()
  local now_ms = floor(started * 1000)
  local keys, owners = {}, {}
  for id, ev in pairs(snap.events) do
    if ev.read_at == snap.read_at and refused_whole(ev, now_ms) then
      local count = bucket_count(ev)
      if not count then
        if warn_now("count:" .. id) then
          ngx.log(ngx.WARN, "admitted keys: event ", id, " has no usable bucket count: ", tostring(ev.buckets))
        end
      else
        for _, tag in ipairs(bucket_tags(id, count)) do
          keys[#keys + 1] = { "hlen", prefix .. format(layout.idempotency, tag) }
          owners[#owners + 1] = id
        end
      end
    end
  end
  if #keys == 0 then return end
  local lens, err = store.run(keys)
  if not lens then
    if warn_now("redis") then ngx.log(ngx.WARN, "admitted keys: ", err) end
    return
  end
  for i, cmd in ipairs(keys) do
    local key, id, len = cmd[2], owners[i], tonumber(lens[i]) or 0
    -- "<length>|<when>" of the last full copy; "<cursor>|<length>|<fields seen>" of one
    -- under way. Each lapses after ttl_s.
    local done_key, scan_key = "admitted:" .. key, "admitted-scan:" .. key
    local done_len, done_at = match(progress:get(done_key) or "", "^(%d+)|([%d.]+)$")
    local cursor, scan_len, seen = match(progress:get(scan_key) or "", "^(%d+)|(%d+)|(%d+)$")
    seen = tonumber(seen)
    if not cursor and len > 0
      and (tonumber(done_len) ~= len or started - tonumber(done_at) >= ttl_s / 2) then
      cursor, scan_len, seen = "0", len, 0
      ngx.log(ngx.INFO, "admitted keys: copying ", len, " records of event ", id, " (", key, ")")
    end
    while cursor do
      ngx.update_time()
      if ngx.now() - started >= budget_s then return end
      if passed:free_space() < passed:capacity() / 4 then
        if warn_now("full") then
          ngx.log(ngx.WARN, "admitted keys: less than a quarter of the idempotency-key dict is free; ",
            "copying paused (event ", id, ")")
        end
        return
      end
      local next_cursor, got = copy_page(key, id, cursor)
      if not next_cursor then
        if warn_now("page") then ngx.log(ngx.WARN, "admitted keys: ", got) end
        return
      end
      seen = seen + got
      if next_cursor ~= "0" then
        cursor = next_cursor
        progress:set(scan_key, cursor .. "|" .. scan_len .. "|" .. seen, ttl_s)
      elseif seen < math.min(tonumber(scan_len), len) then
        -- A scan sees every field that was there throughout; fewer means its cursor
        -- outlived the hash's table (a restarted Redis, a promoted replica): again.
        ngx.log(ngx.INFO, "admitted keys: ", key, " scanned ", seen, " of ", scan_len, "; again")
        cursor, seen = "0", 0
        progress:set(scan_key, "0|" .. scan_len .. "|0", ttl_s)
      else
        progress:set(done_key, scan_len .. "|" .. started, ttl_s)
        progress:delete(scan_key)
        cursor = nil
      end
    end
  end
end

return _M
