-- keep_claimed.lua: while a worker is still creating a batch, reset the idle time of the
-- batch's stream entries this consumer still holds, so that XAUTOCLAIM (which takes
-- entries idle past orders.claim_idle_ms, a stopped worker's) leaves them alone. Entries
-- acknowledged meanwhile, or already taken over by another consumer, are left as they
-- are: a worker never takes back what it has lost.
--
-- KEYS[1]  stream  the bucket's reservations
-- ARGV[1]  the consumer group
-- ARGV[2]  this consumer
-- ARGV[3..] the batch's entry ids: at most 256 a run (READ_CHUNK in
--           core/src/orders/redis.rs, which runs this once per chunk of a batch)
--
-- Returns (mirrored by Kept in core/src/orders/redis.rs):
--   n >= 0  the number of entries kept
local rcall, unpack = redis.call, unpack
local group, consumer = ARGV[1], ARGV[2]
if #ARGV < 3 then return 0 end
-- An entry id "<ms>-<seq>" as two numbers, for finding the batch's first and last.
local function parts(id)
  local ms, seq = string.match(id, '^(%d+)-(%d+)$')
  return tonumber(ms), tonumber(seq)
end
local function before(a, b)
  local am, as = parts(a)
  local bm, bs = parts(b)
  return am < bm or (am == bm and as < bs)
end
local batch, first, last = {}, ARGV[3], ARGV[3]
for i = 3, #ARGV do
  local id = ARGV[i]
  if not parts(id) then return redis.error_reply('ERR not a stream entry id: ' .. id) end
  batch[id] = true
  if before(id, first) then first = id end
  if before(last, id) then last = id end
end
-- This consumer's pending entries from the batch's first to its last: the batch, and
-- at most the consumer's few others (a worker works on one batch at a time).
local pending = rcall('XPENDING', KEYS[1], group, first, last, #ARGV * 2, consumer)
-- One XCLAIM … JUSTID for the batch's entries among them: its arguments built as one
-- table, the ids before JUSTID (unpack in the middle of a list gives one value).
local args = { KEYS[1], group, consumer, 0 }
for _, entry in ipairs(pending) do
  if batch[entry[1]] then args[#args + 1] = entry[1] end
end
if #args == 4 then return 0 end
args[#args + 1] = 'JUSTID'
return #rcall('XCLAIM', unpack(args))
