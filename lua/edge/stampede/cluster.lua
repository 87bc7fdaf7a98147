-- The edge's Redis reads, against one Redis or a Redis Cluster (docs/scaling.md).
-- `run(cmds)` sends a list of read commands and returns their replies in the same order:
-- to the one Redis in a single pipeline, or, on a cluster, one pipeline per node that
-- owns the commands' slots (the slot map read with CLUSTER SLOTS from any seed node and
-- kept until a read fails: a moved slot or a dead node makes the next run read it again).
local redis = require "nginx.redis"
local bit = require "bit"
local band, bxor, lshift = bit.band, bit.bxor, bit.lshift
local byte, find, sub, unpack = string.byte, string.find, string.sub, unpack

local _M = {}

local SLOTS = 16384

-- CRC16/XMODEM, the key hash of Redis Cluster.
local function crc16(s)
  local crc = 0
  for i = 1, #s do
    crc = bxor(crc, lshift(byte(s, i), 8))
    for _ = 1, 8 do
      crc = band(crc, 0x8000) ~= 0 and band(bxor(lshift(crc, 1), 0x1021), 0xffff)
        or band(lshift(crc, 1), 0xffff)
    end
  end
  return crc
end

-- A key's slot: the hash of its first non-empty {tag}, or of the whole key.
function _M.slot(key)
  local open = find(key, "{", 1, true)
  if open then
    local close = find(key, "}", open + 1, true)
    if close and close > open + 1 then key = sub(key, open + 1, close - 1) end
  end
  return crc16(key) % SLOTS
end

local cfg -- {nodes = {{host, port}, ...}, cluster = bool, timeout_ms}
local slot_map -- slot → "host:port" (cluster mode), nil until read

-- opts: {nodes = {"host:port", ...}, cluster = bool, timeout_ms}
function _M.init(opts)
  local nodes = {}
  for _, n in ipairs(opts.nodes) do
    local host, port = string.match(n, "^%s*([^:%s]+):(%d+)%s*$")
    assert(host, "redis node must be host:port, not " .. tostring(n))
    nodes[#nodes + 1] = { host = host, port = tonumber(port) }
  end
  assert(#nodes > 0, "no Redis node configured")
  cfg = { nodes = nodes, cluster = opts.cluster, timeout_ms = opts.timeout_ms }
end

local function connect(host, port, timeout_ms)
  local red = redis:new()
  red:set_timeout(timeout_ms or cfg.timeout_ms)
  local ok, err = red:connect(host, port)
  if not ok then return nil, host .. ":" .. port .. ": " .. tostring(err) end
  return red
end

-- Reads the slot map from the first seed node that answers.
local function read_slot_map()
  local last_err
  for _, n in ipairs(cfg.nodes) do
    local red, err = connect(n.host, n.port)
    if red then
      local ranges
      ranges, err = red:cluster("slots")
      if type(ranges) == "table" then
        red:set_keepalive(10000, 4)
        local map = {}
        for _, r in ipairs(ranges) do
          -- A master whose address the node does not know yet (null, "" or "?" while a
          -- node joins): its slots stay unowned, so a read of them fails and the next
          -- run reads the map again, where a Lua error would end every run the same way.
          local host, port = type(r[3]) == "table" and r[3][1], type(r[3]) == "table" and r[3][2]
          if type(host) == "string" and host ~= "" and host ~= "?" and tonumber(port) then
            local owner = host .. ":" .. port
            for s = r[1], r[2] do map[s] = owner end
          end
        end
        return map
      end
      red:close()
    end
    last_err = err
  end
  return nil, "no seed node gave the slot map: " .. tostring(last_err)
end

-- Sends cmds ({name, key, args...}) to one node in one pipeline; replies by index.
local function pipeline(host, port, cmds, indexes, replies, timeout_ms)
  local red, err = connect(host, port, timeout_ms)
  if not red then return nil, err end
  red:init_pipeline()
  for _, i in ipairs(indexes) do
    local c = cmds[i]
    red[c[1]](red, unpack(c, 2))
  end
  local got
  got, err = red:commit_pipeline()
  if not got then
    red:close()
    return nil, host .. ":" .. port .. ": " .. tostring(err)
  end
  red:set_keepalive(10000, 4)
  for j, i in ipairs(indexes) do
    local reply = got[j]
    -- A reply that is an error ({false, "MOVED …"}) fails the whole run.
    if type(reply) == "table" and reply[1] == false then
      return nil, host .. ":" .. port .. ": " .. tostring(reply[2])
    end
    replies[i] = reply
  end
  return true
end

-- Runs commands (reads, and the edge's writes of admitted.lua) on the masters that own
-- their keys; their replies in order, or nil and an error. `timeout_ms` (optional) for
-- a read known to be large, instead of the configured one.
function _M.run(cmds, timeout_ms)
  local replies = {}
  if #cmds == 0 then return replies end
  if not cfg.cluster then
    local all = {}
    for i = 1, #cmds do all[i] = i end
    local n = cfg.nodes[1]
    local ok, err = pipeline(n.host, n.port, cmds, all, replies, timeout_ms)
    if not ok then return nil, err end
    return replies
  end
  if not slot_map then
    local err
    slot_map, err = read_slot_map()
    if not slot_map then return nil, err end
  end
  local by_node = {}
  for i, c in ipairs(cmds) do
    local owner = slot_map[_M.slot(c[2])]
    if not owner then
      slot_map = nil
      return nil, "no node owns the slot of " .. c[2]
    end
    local list = by_node[owner]
    if not list then
      list = {}
      by_node[owner] = list
    end
    list[#list + 1] = i
  end
  for owner, indexes in pairs(by_node) do
    local host, port = string.match(owner, "^(.+):(%d+)$")
    local ok, err = pipeline(host, tonumber(port), cmds, indexes, replies, timeout_ms)
    if not ok then
      slot_map = nil -- a failover or a moved slot: read the map again next time
      return nil, err
    end
  end
  return replies
end

-- Forget the slot map: the next run reads it again (after a failed refresh; the tests).
function _M.forget()
  slot_map = nil
end

return _M
