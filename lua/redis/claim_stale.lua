-- claim_stale.lua: takes over the reservations a stopped worker left — the group's
-- entries idle past orders.claim_idle_ms, whoever holds them (XCLAIM, as XAUTOCLAIM
-- would) — and says how many another consumer held: only those are a takeover
-- (stampede_reservations_taken_over_total). A worker's own entries idle that long are
-- its own to resume.
--
-- KEYS[1]  stream  the bucket's reservations
-- ARGV[1]  the consumer group
-- ARGV[2]  this consumer
-- ARGV[3]  the least idle time, ms
-- ARGV[4]  the most entries to take: at most 256 a run (READ_CHUNK in
--          core/src/orders/redis.rs, which runs this again for more)
-- ARGV[5]  where in the pending list to start: "-", or "(<id>" after the last entry
--          the previous run looked at (a cursor: what a run took is not idle any more
--          only while the runs are less than the idle time apart)
--
-- Returns {n, entries, looked, last} (mirrored by Claimed in
-- core/src/orders/redis.rs): the entries taken, as XCLAIM gives them (entries deleted
-- from the stream meanwhile are left out), n of which another consumer held; how many
-- pending entries the run looked at, and the last one's id ("" if none).
local rcall, unpack = redis.call, unpack
local consumer = ARGV[2]
local pending = rcall('XPENDING', KEYS[1], ARGV[1], 'IDLE', ARGV[3], ARGV[5], '+', ARGV[4])
if #pending == 0 then return {0, {}, 0, ''} end
-- One XCLAIM for them all. It checks each entry's idle time again, and leaves out
-- entries deleted from the stream (dropping them from the group's pending list; Redis
-- 6.2 answers such an entry with nil).
local args, held_by, claimed = { KEYS[1], ARGV[1], consumer, ARGV[3] }, {}, {}
for _, p in ipairs(pending) do
  args[#args + 1] = p[1]
  held_by[p[1]] = p[2]
end
local others = 0
for _, entry in ipairs(rcall('XCLAIM', unpack(args))) do
  if entry then
    claimed[#claimed + 1] = entry
    if held_by[entry[1]] ~= consumer then others = others + 1 end
  end
end
return {others, claimed, #pending, pending[#pending][1]}
