-- What the edge knows of the sales: window and status per event, sold-out flags, limit
-- overrides; and, apart, the users signed out (auth.lua). One worker per tick (whoever takes the tick's lock in the shared dict)
-- reads Redis and stores a snapshot in the shared dict; every worker's timer copies a
-- new snapshot into a worker-local table. A request reads that table only: no Redis
-- call, and no shared-dict operation but a sale's "asked about" mark, at most once a
-- second per worker and sale (below).
--
-- If Redis does not answer, the last snapshot stays in force (logged once a second);
-- the core checks everything again in its one script, so a stale edge can only let
-- through requests the core then refuses — never sell what Redis does not have.
local ngx = ngx
local cjson = require "cjson.safe"
local store = require "stampede.cluster"
local limit = require "stampede.limit"
local auth = require "stampede.auth"
local layout = require "stampede.keys" -- generated from core/src/keys.rs
local room = require "stampede.room"
local admitted = require "stampede.admitted"
local tonumber, floor, format = tonumber, math.floor, string.format
local shared = ngx.shared

local _M = {}

local dict, cfg
local version = -1
local snapshot_at = 0
-- How long past a sale's end the gate waits for its keys to be copied (gate): as long
-- as a snapshot may be late before the seat stamps and rooms stop trusting it.
local end_grace_ms
-- event id → {open, start_ms, end_ms, all_sold, sold = {[cid string] = true},
-- journeys = {["<cid>:<from>:<to>"] = true}, seat_stamp, room (room.lua; nil: none),
-- buckets (count), read_at (s: when its flags were read), copied (past its end, the
-- keys it admitted all copied: admitted.copied_since)}
local events = {}

local LOCK, SNAPSHOT, VERSION, PUBLISH_LOCK = "refresh-lock", "snapshot", "version", "publish-lock"

-- A train's seat versions (class → changes to its seats) as one string, or nil for an
-- event without any: equal stamps mean no seat of the train changed in between.
local function stamp(versions)
  if type(versions) ~= "table" or #versions == 0 then return nil end
  local pairs_ = {}
  for i = 1, #versions, 2 do pairs_[#pairs_ + 1] = versions[i] .. "=" .. versions[i + 1] end
  table.sort(pairs_)
  return table.concat(pairs_, ",")
end

-- A sale's flags, metadata, seat stamp and room settings are read every tick while it
-- is asked about through this edge (a purchase, a train's availability, a waiting-room
-- poll, within the last SEEN_S: its "seen" mark in the dict) or has a waiting room;
-- otherwise every QUIET_S. Its window and status come from the sales index, read every
-- tick whatever the sale. Every open sale was read every tick, four commands each:
-- with 472 sales on (trains are on sale for days), an idle edge sent Redis about 9 400
-- commands a second. A sale nobody asks about here may so answer its first request
-- from flags up to QUIET_S old (a purchase the core then refuses, or a sold-out answer
-- a restock undid within that second); that request marks it, and the next tick reads
-- it.
local QUIET_S, SEEN_S, MARK_EVERY_S = 1, 5, 1
local SEEN = "seen:"

-- Worker-local: sale id → when this worker last marked it (cleared every minute, so
-- sales gone from the index do not pile up; only listed sales are marked).
local marked, marked_since = {}, 0

-- Marks sale `id` (listed) as asked about, at `now` (s).
local function mark(id, now)
  local at = marked[id]
  if at and now - at < MARK_EVERY_S then return end
  if now - marked_since >= 60 then marked, marked_since = {}, now end
  marked[id] = now
  dict:set(SEEN .. id, true, SEEN_S)
end

-- Whether `id` (`ev` from the index, this tick) may keep what `before` (this worker's
-- last snapshot of it) read, at `now` (s).
local function quiet(id, ev, before, now)
  if not before or not before.read_at or now - before.read_at >= QUIET_S then return false end
  if before.room then return false end
  -- Closed (or reopened) since: read now, so that admitted.lua copies its keys at once.
  if before.open ~= ev.open then return false end
  return not dict:get(SEEN .. id)
end

-- Reads everything from Redis (one Redis, or the nodes of a cluster that own the keys);
-- the snapshot table, or nil and an error.
local function pull()
  local p = cfg.prefix
  local first, err = store.run({
    { "hgetall", p .. layout.sales },
    { "hgetall", p .. layout.edge_limits },
  })
  if not first then return nil, "sales: " .. tostring(err) end
  local sales, overrides = first[1], first[2]
  local now = ngx.now()
  local snap = { events = {}, limits = {} }
  local ids, cmds = {}, {}
  for i = 1, #sales, 2 do
    local id = sales[i]
    local status, start_ms, end_ms = string.match(sales[i + 1], "^(%a+):(%d+):(%d+)$")
    if status then
      local ev = { open = status == "open", start_ms = tonumber(start_ms), end_ms = tonumber(end_ms),
        sold = {}, journeys = {}, read_at = now }
      snap.events[id] = ev
      local before = events[id]
      if quiet(id, ev, before, now) then
        ev.sold, ev.journeys, ev.all_sold, ev.read_at = before.sold, before.journeys, before.all_sold, before.read_at
        ev.buckets, ev.seat_stamp = before.buckets, before.seat_stamp
      else
        ids[#ids + 1] = id
        cmds[#cmds + 1] = { "hgetall", p .. format(layout.sold_out, id) }
        cmds[#cmds + 1] = { "hmget", p .. format(layout.meta, id), "categories", "epoch", "buckets" }
        cmds[#cmds + 1] = { "hgetall", p .. format(layout.segment_versions, id) }
        cmds[#cmds + 1] = room.settings_cmd(p, id)
      end
    end
  end
  local replies = {}
  if #cmds > 0 then
    local perr
    replies, perr = store.run(cmds)
    if not replies then return nil, "events: " .. tostring(perr) end
  end
  local more, takers = {}, {}
  local now_ms = floor(now * 1000)
  for i, id in ipairs(ids) do
    local ev = snap.events[id]
    ev.room = room.from_reply(replies[4 * i])
    if ev.room then takers[#takers + 1] = room.more_cmds(p, id, ev.room, more, now_ms, ev.end_ms) end
  end
  if #more > 0 then
    local extra, merr = store.run(more)
    if not extra then return nil, "waiting rooms: " .. tostring(merr) end
    for _, take in ipairs(takers) do take(extra) end
  end
  for i, id in ipairs(ids) do
    local ev, flags, meta = snap.events[id], replies[4 * i - 3], replies[4 * i - 2]
    local categories, epoch
    if type(meta) == "table" then
      categories, epoch = meta[1], meta[2]
      ev.buckets = tonumber(meta[3])
    end
    if type(epoch) ~= "string" then epoch = "0" end
    -- The keys' generation too: a rebuild may restart the versions where they were.
    local versions = stamp(replies[4 * i - 1])
    ev.seat_stamp = versions and (epoch .. "|" .. versions)
    local sold = 0
    if type(flags) == "table" then
      for j = 1, #flags, 2 do
        local field = flags[j]
        -- "<category>" sold out; "<category>:<from>:<to>": no seat on a train journey.
        if string.find(field, ":", 1, true) then
          ev.journeys[field] = true
        else
          ev.sold[field] = true
          sold = sold + 1
        end
      end
    end
    local count = 0
    if type(categories) == "string" then
      for _ in string.gmatch(categories, "[^,]+") do count = count + 1 end
    end
    ev.all_sold = count > 0 and sold >= count
  end
  if type(overrides) == "table" then
    for i = 1, #overrides, 2 do
      snap.limits[overrides[i]] = cjson.decode(overrides[i + 1])
    end
  end
  return snap
end

-- Signed-out users (auth.lua), in a dict of their own (`revoked`): the leader reads the
-- hash's version every tick and, when it changed, the changes since the dict's version
-- from the hash's log (revoke_tokens.lua: `l:<version>`, the last LOG_KEEP), or the whole
-- hash when the log no longer has them (the first read, more changes than the log
-- keeps) or when the change that made the edge's version is not the one the edge read
-- (a Redis failed over to a replica behind it, or restored from an older copy, that
-- reached that version again with other sign-outs). Each user's entry goes in the dict (raised
-- only, kept five minutes past what it voids), and each read as a numbered batch
-- ("#c:<n>": the changes, or "*" after a whole read) that the workers apply to their
-- own tables; a worker that missed a batch, or finds "*", copies every entry of the
-- dict, as it does once a minute to drop those past; and every five minutes the whole
-- hash is read again all the same. A sign-out costs each edge the
-- change, not the whole hash: with 100 000 users signed out and four sign-outs a second,
-- re-reading and re-encoding the hash for every worker took 0.88 of a core (measured).
-- In a call of its own: on a cluster its shard may be down while the sales' are not. A
-- failed read keeps the last.
local LOG_KEEP = 1000 -- revoke_tokens.lua's, core/src/auth/revoked.rs
local KEEP_PAST_S, BATCH_TTL_S, REBUILD_S, WHOLE_TIMEOUT_MS, AGAIN_S = 300, 60, 60, 3000, 300
local rdict -- the revoked dict
local function pull_revoked()
  local key = cfg.prefix .. layout.revoked_tokens
  local have, have_change = rdict:get("#v"), rdict:get("#vc") or ""
  -- The version, and the change that made the edge's: a Redis that failed over to a
  -- replica behind it, or was restored from an older copy, may reach the edge's version
  -- again with other changes; it is told by that change differing.
  local got, err = store.run({ { "hmget", key, "v", "l:" .. (have or "0") } })
  if not got then return nil, err end
  local v = type(got[1][1]) == "string" and got[1][1] or "0"
  local same = (type(got[1][2]) == "string" and got[1][2] or "") == have_change
  -- Every AGAIN_S the whole hash again all the same (the cores read it whole once a
  -- minute, to prune); a failed one waits its turn again, the changes read meanwhile.
  local now_s = ngx.now()
  local again = have and now_s - (rdict:get("#whole_at") or 0) >= AGAIN_S
  if again then rdict:set("#whole_at", now_s) end
  if v == have and same and not again then return true end
  local changes -- user id, Unix s, user id, Unix s, ...
  local last_change = ""
  local hv, nv = tonumber(have), tonumber(v)
  if same and not again and hv and nv and nv > hv and nv - hv <= LOG_KEEP then
    local cmd = { "hmget", key }
    for i = hv + 1, nv do cmd[#cmd + 1] = "l:" .. i end
    local logged
    logged, err = store.run({ cmd })
    if not logged then return nil, err end
    changes = {}
    for _, c in ipairs(logged[1]) do
      local user, untl = string.match(type(c) == "string" and c or "", "^(%d+):(%d+)$")
      if not user then
        changes = nil -- no longer in the log: the whole hash
        break
      end
      changes[#changes + 1] = user
      changes[#changes + 1] = tonumber(untl)
      last_change = c
    end
  end
  local whole = not changes
  if whole then
    local all
    -- Every signed-out user: a large reply may take longer than a tick's reads.
    all, err = store.run({ { "hgetall", key } }, WHOLE_TIMEOUT_MS)
    if not all then return nil, err end
    changes = {}
    local flat = type(all[1]) == "table" and all[1] or {}
    local fields = {}
    for i = 1, #flat, 2 do
      fields[flat[i]] = flat[i + 1]
      -- A user id (digits); not `v`, nor a logged change.
      if string.find(flat[i], "^%d+$") and tonumber(flat[i + 1]) then
        changes[#changes + 1] = flat[i]
        changes[#changes + 1] = tonumber(flat[i + 1])
      end
    end
    v = fields.v or "0"
    last_change = fields["l:" .. v] or ""
  end
  local now = ngx.time()
  local batch = {}
  for i = 1, #changes, 2 do
    local user, untl = changes[i], changes[i + 1]
    local before = rdict:get(user)
    -- Equal too: an entry set by a read that then failed is in the next one's batch.
    if (not before or untl >= before) and untl + KEEP_PAST_S > now then
      local ok, serr = rdict:safe_set(user, untl, untl + KEEP_PAST_S - now)
      if not ok then return nil, "the revoked dict: " .. tostring(serr) end
      if not whole then batch[#batch + 1] = user .. ":" .. untl end
    end
  end
  local n = rdict:incr("#seq", 1, 0)
  -- Not evicting: a batch that does not fit is missed, and the workers copy the dict.
  rdict:safe_set("#c:" .. n, whole and "*" or table.concat(batch, ","), BATCH_TTL_S)
  rdict:set("#v", v)
  rdict:set("#vc", last_change)
  if whole then rdict:set("#whole_at", now_s) end
  rdict:incr(not whole and "#changes" or again and "#again" or "#whole", 1, 0)
  return true
end

-- This worker's copy of the signed-out users: the batches since its own, applied; or
-- every entry of the dict, copied.
local revoked_seq, revoked_local, rebuilt_at = 0, {}, 0
local function adopt_revoked()
  local seq = rdict:get("#seq")
  if not seq then return end
  local now = ngx.now()
  local t = revoked_local
  if seq ~= revoked_seq then
    local batches = {}
    if seq > revoked_seq and revoked_seq > 0 then
      for k = revoked_seq + 1, seq do
        local b = rdict:get("#c:" .. k)
        if not b or b == "*" then
          batches = nil
          break
        end
        batches[#batches + 1] = b
      end
    else
      batches = nil
    end
    if batches and now - rebuilt_at < REBUILD_S then
      for _, b in ipairs(batches) do
        for user, untl in string.gmatch(b, "(%d+):(%d+)") do
          untl = tonumber(untl)
          if not t[user] or t[user] < untl then t[user] = untl end
        end
      end
      revoked_seq = seq
      return
    end
  elseif now - rebuilt_at < REBUILD_S then
    return
  end
  t = {}
  for _, user in ipairs(rdict:get_keys(0)) do
    if string.byte(user) ~= 35 then -- "#": the dict's own keys
      local untl = rdict:get(user)
      if untl then t[user] = untl end
    end
  end
  revoked_local, revoked_seq, rebuilt_at = t, seq, now
  auth.set_revoked(t)
end

-- Adopts the shared snapshot if it is newer than this worker's.
local function adopt()
  adopt_revoked()
  local v = dict:get(VERSION)
  if v and v ~= version then
    local snap = cjson.decode(dict:get(SNAPSHOT) or "")
    if snap then
      events = snap.events
      snapshot_at = snap.at or 0
      limit.apply(snap.limits)
      version = v
    end
  end
  -- Which snapshot this worker answers from, for /edge/stats (a worker left behind
  -- shows there; a test waits for every worker to have the one published).
  if version ~= -1 then dict:set("adopted:" .. ngx.worker.id(), version, 5) end
end

local last_warning, last_revoked_warning = 0, 0
local function refresh(premature)
  if premature then return end
  -- Leader for this tick: the first worker to add the lock pulls from Redis, from the
  -- newest snapshot (what it may keep of a sale not on is what the last leader read).
  if dict:add(LOCK, true, cfg.interval_s * 0.9) then
    adopt()
    local published = dict:get(VERSION)
    -- The keys this edge answered 202 since the last tick, for the other edges (even
    -- when the snapshot cannot be read: on a cluster, other shards may take theirs).
    local pok, perr = pcall(admitted.publish)
    if not pok then ngx.log(ngx.ERR, "admitted keys: ", perr) end
    -- A Lua error while reading (a reply of a shape not expected) fails this tick like
    -- a Redis error, logged below, and the slot map is read again next tick; unguarded,
    -- the timer's run ended with the snapshot kept and no "refresh failed" said.
    local pok, snap, err = pcall(pull)
    if not pok then
      snap, err = nil, "error reading the state: " .. tostring(snap)
      store.forget()
    end
    if snap then
      -- Before the snapshot is out: a sale this snapshot first refuses whole (closed,
      -- sold out) has the keys it admitted copied, as far as the time budget goes,
      -- before a worker refuses it; and other edges' keys of a sale partly sold out.
      -- A failure there never stops the snapshot.
      local ok, serr = pcall(admitted.sync, snap)
      if not ok then ngx.log(ngx.ERR, "admitted keys: ", serr) end
      -- Which sales past their end have every key they admitted copied (the gate's
      -- cue to refuse them); none, on an error.
      local now_ms = floor(ngx.now() * 1000)
      for id, ev in pairs(snap.events) do
        if now_ms >= ev.end_ms then
          local cok, copied = pcall(admitted.copied_since, id, ev, ev.end_ms)
          ev.copied = cok and copied or nil
        end
      end
      -- Unless a later leader (this one's lock lapsed on a slow Redis) published first;
      -- the check and the publish under a lock of their own (they do not yield), or two
      -- leaders of two workers could both pass the check and the one with the older
      -- reads publish last (review).
      if dict:add(PUBLISH_LOCK, true, 1) then
        if dict:get(VERSION) == published then
          snap.at = ngx.now()
          -- A snapshot the dict cannot hold is not published (the workers keep theirs and
          -- it is logged): published, the empty value read back would freeze them.
          local encoded, serr = cjson.encode(snap)
          local ok = false
          if encoded then ok, serr = dict:set(SNAPSHOT, encoded) end
          if ok then
            dict:incr(VERSION, 1, 0)
          else
            ngx.log(ngx.ERR, "edge state: the snapshot does not fit in the state dict: ", serr)
          end
        end
        dict:delete(PUBLISH_LOCK)
      end
    else
      admitted.redis_failed()
    end
    if not snap and ngx.now() - last_warning >= 1 then
      last_warning = ngx.now()
      ngx.log(ngx.WARN, "edge state refresh from Redis failed, keeping the last state: ", err)
    end
    -- After the snapshot, which a whole read of many signed-out users would delay; under
    -- a lock of its own, as such a read may outlast the tick's lock (the next leader
    -- would read it all again).
    if rdict:add("#lock", true, WHOLE_TIMEOUT_MS / 1000 + 1) then
      local pok, rok, rerr = pcall(pull_revoked)
      if not pok then rok, rerr = false, rok end
      rdict:delete("#lock")
      if not rok and ngx.now() - last_revoked_warning >= 1 then
        last_revoked_warning = ngx.now()
        ngx.log(ngx.WARN, "signed-out tokens: reading them failed, keeping the last: ", rerr)
      end
    end
  end
  -- Every worker: adopt a newer snapshot.
  adopt()
end

-- opts: {dict, revoked_dict, nodes = {"host:port", ...}, cluster, prefix, timeout_ms, interval_s}
function _M.init(opts)
  dict = assert(shared[opts.dict], "lua_shared_dict " .. tostring(opts.dict) .. " is not declared")
  rdict = assert(shared[opts.revoked_dict], "lua_shared_dict " .. tostring(opts.revoked_dict) .. " is not declared")
  cfg = opts
  end_grace_ms = (5 * opts.interval_s + 1) * 1000
  store.init({ nodes = opts.nodes, cluster = opts.cluster, timeout_ms = opts.timeout_ms })
end

-- From init_worker: start this worker's refresh timer.
function _M.start()
  assert(ngx.timer.every(cfg.interval_s, refresh))
  assert(ngx.timer.at(0, refresh))
end

-- The seat stamp of a train (string) as of the last snapshot, or nil (no train of that
-- id in it). nil, true when that snapshot is older than a few refreshes (Redis out of
-- reach): a stamp that cannot move proves nothing.
function _M.seat_stamp(event_id)
  local now = ngx.now()
  if now - snapshot_at > 5 * cfg.interval_s + 1 then return nil, true end
  local ev = events[event_id]
  if not ev then return nil end
  mark(event_id, now)
  return ev.seat_stamp
end

-- The event and its waiting room (nil when it has none) as of the last snapshot, or
-- nothing when that snapshot is older than a few refreshes: the core answers then.
function _M.room(event_id)
  local ev = events[event_id]
  if ev then mark(event_id, ngx.now()) end
  if not ev or not ev.room or ngx.now() - snapshot_at > 5 * cfg.interval_s + 1 then return nil end
  return ev, ev.room
end

-- The sale gate and sold-out check for an event id (string). Returns nil when the
-- request may go on, else status, code, message.
--
-- A sale past its end by this worker's clock is refused once the snapshot answered from
-- says every key the sale admitted was copied after the end (admitted.copied_since), so
-- a retry of a purchase admitted through another edge still hears its 202 here. Until
-- then (a refresh or two; longer for a big sale's copy) purchases not refused by the
-- flags go on to the core, which answers by its own clock and records: that retry's
-- 202, NOT_OPEN to anything else. Refused all the same end_grace_ms after the end (a
-- leader that stopped publishing, Redis out of reach, a copy not done by then).
function _M.gate(event_id, category_of)
  local ev = events[event_id]
  local now = ngx.now()
  if ev then mark(event_id, now) end
  local now_ms = floor(now * 1000)
  if not ev or not ev.open or now_ms < ev.start_ms then
    return 403, "NOT_OPEN", "the sale is not open"
  end
  if now_ms >= ev.end_ms and (ev.copied or now_ms - ev.end_ms >= end_grace_ms) then
    return 403, "NOT_OPEN", "the sale is not open"
  end
  if ev.all_sold then
    return 409, "SOLD_OUT", "sold out"
  end
  if next(ev.sold) or next(ev.journeys or {}) then
    local cid, from, to = category_of()
    if cid and ev.sold[cid] then return 409, "SOLD_OUT", "sold out" end
    if cid and from and to and (ev.journeys or {})[cid .. ":" .. from .. ":" .. to] then
      return 409, "SOLD_OUT", "no seat on this journey"
    end
  end
end

return _M
