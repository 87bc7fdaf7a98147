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
-- hash is counted at most once a second and scanned again only when its length changed,
-- or after half the dict's lifetime (to keep the copies alive while the sale is listed),
-- in pages of PAGE fields, for at most budget_s a refresh. The per-request cost is
-- unchanged: the refusal path already looks its key up. Copying pauses while less than
-- a quarter of the dict is free, so the copies take at most about three quarters of it.
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

-- A Redis read of this edge failed (state.lua's or these): a scan under way starts
-- again, as its cursor may belong to a Redis since restarted or to a replica since
-- promoted, whose table another seed orders otherwise.
function _M.redis_failed()
  progress:incr("admitted-gen", 1, 0)
end

-- Copies one page of `key`'s records of `event_id`; the next cursor ("0": done), or nil
-- and an error (Redis's, or the dict's refusing a key: left for the next refresh).
local function copy_page(key, event_id, cursor)
  local replies, err = store.run({ { "hscan", key, cursor, "COUNT", PAGE } })
  if not replies then
    _M.redis_failed()
    return nil, err
  end
  local reply = replies[1]
  local fields = reply[2]
  for i = 1, #fields, 2 do
    local user, k = match(fields[i], "^(%d+):(.+)$")
    if user then
      local ok, serr = passed:safe_set(user .. ":" .. event_id .. ":" .. k, _M.QUEUED, ttl_s)
      if not ok then return nil, "idempotency-key dict: " .. tostring(serr) end
    end
  end
  return reply[1]
end

-- The bucket count an event's meta gives (nil: not a count this edge can use). An event
-- loaded before the meta had it counts as one bucket: right for most; one of several
-- gets its count at its next load or close (sale_status.lua), and until then nothing of
-- it is copied.
local function bucket_count(ev)
  local n = ev.buckets or 1
  if n >= 1 and n <= MAX_BUCKETS and n == floor(n) then return n end
end

local CHECK_S = 1 -- a copied bucket's record count is read again at most this often

-- Room in the dict: at least a quarter of it free, after dropping some expired keys.
local function room()
  local quarter = passed:capacity() / 4
  if passed:free_space() >= quarter then return true end
  passed:flush_expired(1000)
  return passed:free_space() >= quarter
end

-- From the refresh leader, with a snapshot (state.lua's) before it is published: every
-- sale it refuses whole, with its bucket count. A bucket's records are counted (HLEN)
-- at most once a CHECK_S; scanned when the count changed or the copy is half the dict's
-- lifetime old; a scan under way goes on each refresh. Stops after budget_s, or when
-- the dict has not a quarter free; what was copied stays.
function _M.sync(snap)
  ngx.update_time()
  local started = ngx.now()
  local now_ms = floor(started * 1000)
  local gen = tostring(progress:get("admitted-gen") or 0)
  -- Per bucket: "admitted:<key>" = "<length>|<copied at>|<counted at>" of the last full
  -- copy; "admitted-scan:<key>" = "<cursor>|<length>|<generation>" of one under way.
  local scans, asks = {}, {}
  for id, ev in pairs(snap.events) do
    if refused_whole(ev, now_ms) then
      local count = bucket_count(ev)
      if not count then
        if warn_now("count:" .. id) then
          ngx.log(ngx.WARN, "admitted keys: event ", id, " has no usable bucket count: ", tostring(ev.buckets))
        end
      else
        for _, tag in ipairs(bucket_tags(id, count)) do
          local key = prefix .. format(layout.idempotency, tag)
          local cursor, scan_len, scan_gen = match(progress:get("admitted-scan:" .. key) or "", "^(%d+)|(%d+)|(%d+)$")
          if cursor then
            if scan_gen ~= gen then cursor = "0" end
            scans[#scans + 1] = { key = key, id = id, cursor = cursor, len = tonumber(scan_len) }
          else
            local done_len, done_at, counted_at =
              match(progress:get("admitted:" .. key) or "", "^(%d+)|([%d.]+)|([%d.]+)$")
            if not counted_at or started - tonumber(counted_at) >= CHECK_S then
              asks[#asks + 1] = { key = key, id = id, done_len = tonumber(done_len), done_at = tonumber(done_at) }
            end
          end
        end
      end
    end
  end
  if #asks > 0 then
    local cmds = {}
    for i, a in ipairs(asks) do cmds[i] = { "hlen", a.key } end
    local lens, err = store.run(cmds)
    if not lens then
      _M.redis_failed()
      if warn_now("redis") then ngx.log(ngx.WARN, "admitted keys: ", err) end
      return
    end
    for i, a in ipairs(asks) do
      local len = tonumber(lens[i]) or 0
      if len > 0 and (a.done_len ~= len or started - a.done_at >= ttl_s / 2) then
        ngx.log(ngx.INFO, "admitted keys: copying ", len, " records of event ", a.id, " (", a.key, ")")
        scans[#scans + 1] = { key = a.key, id = a.id, cursor = "0", len = len }
      else
        local done_at = len == a.done_len and a.done_at or started
        progress:set("admitted:" .. a.key, len .. "|" .. done_at .. "|" .. started, ttl_s)
      end
    end
  end
  for _, scan in ipairs(scans) do
    local cursor = scan.cursor
    while cursor do
      ngx.update_time()
      if ngx.now() - started >= budget_s then return end
      if not room() then
        if warn_now("full") then
          ngx.log(ngx.WARN, "admitted keys: less than a quarter of the idempotency-key dict is free; ",
            "copying paused (event ", scan.id, ")")
        end
        return
      end
      local next_cursor, perr = copy_page(scan.key, scan.id, cursor)
      if not next_cursor then
        if warn_now("page") then ngx.log(ngx.WARN, "admitted keys: ", perr) end
        return
      end
      if next_cursor ~= "0" then
        cursor = next_cursor
        progress:set("admitted-scan:" .. scan.key, cursor .. "|" .. scan.len .. "|" .. gen, ttl_s)
      else
        progress:set("admitted:" .. scan.key, scan.len .. "|" .. started .. "|" .. started, ttl_s)
        progress:delete("admitted-scan:" .. scan.key)
        cursor = nil
      end
    end
  end
end

return _M
