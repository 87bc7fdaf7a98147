-- keep_claimed.lua: while a worker is still creating a batch, reset the idle time of the
-- batch's stream entries this consumer still holds, so that XAUTOCLAIM (which takes
-- entries idle past orders.claim_idle_ms, a stopped worker's) leaves them alone. Entries
-- acknowledged meanwhile, or already taken over by another consumer, are left as they
-- are: a worker never takes back what it has lost.
--
-- KEYS[1]  stream  the bucket's reservations
-- ARGV[1]  the consumer group
-- ARGV[2]  this consumer
-- ARGV[3..] entry ids of the batch: at most 256 a run, in stream order
--           (keep_claimed_runs in core/src/orders/redis.rs splits a batch so)
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
-- This consumer's pending entries from the run's first to its last, a page at a time
-- (the consumer may hold others in between: a batch's ids given out of order, or
-- another batch's), and one XCLAIM … JUSTID for the run's entries among them: its
-- arguments built as one table, the ids before JUSTID (unpack in the middle of a list
-- gives one value).
local PAGE = 512
local args, from = { KEYS[1], group, consumer, 0 }, first
while true do
  local page = rcall('XPENDING', KEYS[1], group, from, last, PAGE, consumer)
  for _, entry in ipairs(page) do
    if batch[entry[1]] then args[#args + 1] = entry[1] end
  end
  if #page < PAGE then break end
  from = '(' .. page[#page][1]
end
if #args == 4 then return 0 end
args[#args + 1] = 'JUSTID'
return #rcall('XCLAIM', unpack(args))
