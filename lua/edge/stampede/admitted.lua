-- The purchases a sale admitted, known to every edge: so that a retry through any edge
-- reaches the core, which answers it as it did the first time.
--
-- A purchase whose Idempotency-Key an edge let through skips that edge's sale window and
-- sold-out flags (access.lua), so that its repeat reaches the core. Those keys were the
-- edge's own: a buyer whose first request went through another edge, or through this
-- one before nginx restarted, was told SOLD_OUT or NOT_OPEN though admitted. Two ways
-- in, both run by the refresh leader within a time budget a refresh:
--
-- 1. Shared as they happen. A key whose answer was, or may have been, a 202 (access.lua's
--    purchase_answered) is put in an outbox (its own dict); each refresh publishes the
--    outbox to each sale's stream of keys let through (`{ev:<id>}:passed`, entries of
--    up to CHUNK keys, the field `edge` first with this edge's id), and copies the
--    entries other edges added to the streams of the sales it may refuse a purchase of
--    while they sell (some category or journey sold out) into the dict, as answered
--    202, from the start of the stream for a sale it has not followed before (an edge
--    started since). The stream is trimmed to passed_ttl_s at every write and expires
--    that long after the last. A retry through another edge meets the key there a
--    refresh or two after the first answer (this edge's publish, the other's read).
-- 2. Copied from the records once a listed sale is refused whole (closed, past its end,
--    every category sold out), for keys no edge published (admitted straight through
--    a core, or more than passed_ttl_s ago): the sale's Idempotency-Key records —
--    reserve.lua's `<user>:<key>` fields, written for admitted purchases only. Such a
--    sale's records no longer grow: each bucket's record hash is counted at most once a
--    second and scanned again only when its length changed, or after half the dict's
--    lifetime (to keep the copies alive while the sale is listed), in pages of PAGE
--    fields.
--
-- The per-request cost of a refusal is unchanged (it already looks its key up); a
-- purchase answered 202 adds a dict read and a list push (the outbox dict's lock).
-- Copying pauses while less than a quarter of the dict is free, so the copies take at
-- most about three quarters of it.
-- Not covered: a sale no longer listed (retired after its end), whose copies lapse;
-- keys not yet published when nginx restarts, or dropped from a full outbox; a key
-- published to a Redis master that failed over before its replica had it.
local ngx = ngx
local store = require "stampede.cluster"
local layout = require "stampede.keys" -- generated from core/src/keys.rs
local floor, format, match, tonumber = math.floor, string.format, string.match, tonumber

local _M = {}

_M.QUEUED = 2 -- access.lua's state of a key answered (maybe) 202

local PAGE = 1000
local SLOTS = 16384
local MAX_BUCKETS = 16 -- core/src/domain/event.rs's MAX_BUCKETS

local OUTBOX = "outbox"  -- list in the outbox dict: keys to publish
local OUTBOX_MAX = 25000 -- the oldest dropped past this (~6 MB of the dict's 8)
local ROUND = 5000       -- keys taken from the outbox at a time

local passed, progress, outbox, ttl_s, prefix, budget_s

-- opts: {passed_dict, passed_ttl_s, state_dict, outbox_dict, prefix, budget_s}
function _M.init(opts)
  local function dict(name)
    return assert(ngx.shared[name], "lua_shared_dict " .. tostring(name) .. " is not declared")
  end
  passed, progress, outbox = dict(opts.passed_dict), dict(opts.state_dict), dict(opts.outbox_dict)
  ttl_s, prefix, budget_s = opts.passed_ttl_s, opts.prefix, opts.budget_s
end

-- This edge (nginx instance)'s id in the streams: its own entries are not copied back.
-- Kept in the outbox dict (never evicted there: it only holds this and the list).
local function edge_id()
  local id = outbox:get("edge-id")
  if id then return id end
  local f = io.open("/dev/urandom", "rb")
  local bytes = f and f:read(8) or (tostring(ngx.now()) .. ngx.worker.pid())
  if f then f:close() end
  id = string.gsub(bytes, ".", function(c) return format("%02x", string.byte(c)) end)
  outbox:add("edge-id", id) -- the first worker's id wins
  return outbox:get("edge-id") or id
end

local warned = {} -- what → when last logged (s): one line a minute each
local function warn_now(what)
  local now = ngx.now()
  if (warned[what] or 0) + 60 > now then return false end
  warned[what] = now
  return true
end

-- From access.lua's header filter: `key` ("<user>:<event>:<Idempotency-Key>") was just
-- answered, or may have been answered, 202 here; published at the next refresh.
function _M.queued(key)
  local n, err = outbox:rpush(OUTBOX, key)
  if not n then
    if warn_now("outbox") then ngx.log(ngx.WARN, "admitted keys: the outbox refused a key: ", err) end
    return
  end
  if n > OUTBOX_MAX then
    outbox:lpop(OUTBOX)
    if warn_now("outbox-full") then
      ngx.log(ngx.WARN, "admitted keys: ", OUTBOX_MAX, " keys wait to be published (Redis out of reach?); ",
        "the oldest are dropped: their retries through other edges meet those edges' flags")
    end
  end
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

local CHUNK = 1000     -- keys per stream entry
local FOLLOW_PAGE = 4 -- stream entries read per call (at most 4 000 keys)

-- Sends one sale's keys to its stream, in entries of CHUNK keys. True, or nil and an
-- error.
local function send(event_id, keys, me, oldest)
  local stream, cmds = prefix .. format(layout.passed, event_id), {}
  for first = 1, #keys, CHUNK do
    local cmd = { "xadd", stream, "MINID", "~", oldest, "*", "edge", me }
    for i = first, math.min(first + CHUNK - 1, #keys) do
      cmd[#cmd + 1] = keys[i]
      cmd[#cmd + 1] = ""
    end
    cmds[#cmds + 1] = cmd
  end
  cmds[#cmds + 1] = { "pexpire", stream, format("%d", ttl_s * 1000) }
  return store.run(cmds)
end

-- Puts keys back in the outbox (a sale whose stream could not be written).
local function put_back(keys)
  for _, key in ipairs(keys) do
    local n, err = outbox:rpush(OUTBOX, key)
    if not n then
      if warn_now("put-back") then ngx.log(ngx.WARN, "admitted keys: a key lost from the outbox: ", err) end
      return
    end
  end
end

-- From the refresh leader, every tick, whether the snapshot could be read or not:
-- publishes the outbox, ROUND keys at a time, each sale's to its own stream (one round
-- trip per sale, so a shard that fails keeps only its sales' keys back), for at most
-- half of budget_s. Entries older than passed_ttl_s (by this edge's clock) are trimmed.
function _M.publish()
  ngx.update_time()
  local started = ngx.now()
  local me = edge_id()
  repeat
    local popped, by_event, order = {}, {}, {}
    for _ = 1, ROUND do
      local key = outbox:lpop(OUTBOX)
      if not key then break end
      popped[#popped + 1] = key
      local event_id = match(key, "^%d+:(%d+):")
      if event_id then
        local list = by_event[event_id]
        if not list then
          list = {}
          by_event[event_id] = list
          order[#order + 1] = event_id
        end
        list[#list + 1] = key
      end
    end
    local oldest = format("%d", floor(started * 1000) - ttl_s * 1000)
    local ok, err = pcall(function()
      for i, id in ipairs(order) do
        local sent, serr = send(id, by_event[id], me, oldest)
        if not sent then
          if warn_now("publish") then ngx.log(ngx.WARN, "admitted keys: publishing for event ", id, ": ", serr) end
          put_back(by_event[id])
        end
        order[i] = false -- done, sent or put back
      end
    end)
    if not ok then
      -- A bug more likely than not; the keys not yet sent are not lost to it.
      ngx.log(ngx.ERR, "admitted keys: publishing: ", err)
      for _, id in ipairs(order) do
        if id then put_back(by_event[id]) end
      end
      return
    end
    ngx.update_time()
  until #popped < ROUND or ngx.now() - started >= budget_s / 2
end

-- Whether `ev` sells and this edge may refuse some of its purchases: open, before its
-- end, some category or train journey flagged sold out.
local function partly_refused(ev, now_ms)
  return ev.open and now_ms < ev.end_ms and (next(ev.sold or {}) ~= nil or next(ev.journeys or {}) ~= nil)
end

-- Copies what other edges published to `event_id`'s stream since the last read, a page
-- at a time until it is read to its end, or until `deadline` (s), or while less than a
-- quarter of the dict is free. True, or nil and an error.
local function follow(event_id, deadline, now_ms, me)
  local stream = prefix .. format(layout.passed, event_id)
  local at_key = "passed-at:" .. event_id
  while true do
    ngx.update_time()
    if ngx.now() >= deadline then return true end
    if not room() then
      if warn_now("full") then
        ngx.log(ngx.WARN, "admitted keys: less than a quarter of the idempotency-key dict is free; ",
          "copying paused (event ", event_id, ")")
      end
      return true
    end
    local last = progress:get(at_key) or "0-0"
    local replies, err = store.run({ { "xrange", stream, "(" .. last, "+", "COUNT", FOLLOW_PAGE } })
    if not replies then return nil, err end
    local entries = replies[1]
    if type(entries) ~= "table" or #entries == 0 then return true end
    for _, entry in ipairs(entries) do
      local id, fields = entry[1], entry[2]
      local ms = tonumber(match(id, "^(%d+)%-")) or now_ms
      local keep = ttl_s - (now_ms - ms) / 1000
      if type(fields) == "table" and fields[1] == "edge" and fields[2] ~= me and keep >= 1 then
        for i = 3, #fields, 2 do
          local key = fields[i]
          if match(key, "^%d+:(%d+):") == event_id then
            local ok, serr = passed:safe_set(key, _M.QUEUED, keep)
            if not ok then return nil, "idempotency-key dict: " .. tostring(serr) end
          end
        end
      end
      progress:set(at_key, id, ttl_s)
    end
    if #entries < FOLLOW_PAGE then return true end
  end
end

local turn = 0 -- which followed sale goes first this refresh (each gets a turn)

-- From the refresh leader, with a snapshot (state.lua's) before it is published: the
-- streams of the sales it partly refuses followed, for at most half of budget_s (each
-- sale first in turn); and every sale it refuses whole copied from its records, with
-- its bucket count. A bucket's records are counted (HLEN) at most once a CHECK_S;
-- scanned when the count changed or the copy is half the dict's lifetime old; a scan
-- under way goes on each refresh. Stops after budget_s, or when the dict has not a
-- quarter free; what was copied stays.
function _M.sync(snap)
  ngx.update_time()
  local started = ngx.now()
  local now_ms = floor(started * 1000)
  local followed = {}
  for id, ev in pairs(snap.events) do
    if partly_refused(ev, now_ms) then followed[#followed + 1] = id end
  end
  if #followed > 0 then
    table.sort(followed)
    turn = turn + 1
    local me = edge_id()
    for k = 0, #followed - 1 do
      local id = followed[(turn + k) % #followed + 1]
      local ok, err = follow(id, started + budget_s / 2, now_ms, me)
      if not ok and warn_now("follow:" .. id) then
        ngx.log(ngx.WARN, "admitted keys: following event ", id, ": ", err)
      end
    end
  end
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

-- Whether the keys sale `id` (`ev`, state.lua's snapshot entry) admitted until
-- `since_ms` are all in the dict: each bucket's records counted at or after it, with
-- no copy of them under way (sync). state.lua's gate refuses a sale past its end only
-- then (or a while after).
function _M.copied_since(id, ev, since_ms)
  local count = bucket_count(ev)
  if not count then return false end
  for _, tag in ipairs(bucket_tags(id, count)) do
    local key = prefix .. format(layout.idempotency, tag)
    if progress:get("admitted-scan:" .. key) then return false end
    local counted_at = match(progress:get("admitted:" .. key) or "", "|([%d.]+)$")
    if not counted_at or tonumber(counted_at) * 1000 < since_ms then return false end
  end
  return true
end

return _M
