-- move_in.lua: the second step of a move (move_out.lua): credits the units where they
-- go, once per move id, whoever calls it (the core that moved them, or the sweeper
-- finishing a move whose record outlived a few seconds), and only into the generation
-- of the keys they were taken from.
--
-- KEYS[1] stock     hash  category id → units (the pool's or the bucket's)
-- KEYS[2] credited  set   the move ids this place has been credited with
-- KEYS[3] meta      hash  this place's metadata (the event's for the pool), its `epoch`
-- ARGV[1] category id   ARGV[2] units   ARGV[3] move id   ARGV[4] the move's epoch
--
-- Returns (mirrored by Credited in core/src/buckets.rs):
--    1 NOW       credited now
--    0 BEFORE    credited before: nothing changed
--   -1 STALE     the place was rebuilt from MySQL since the units were taken (which
--                counted them afresh): nothing credited, the move is void
--   -2 NOT_YET   the place is not loaded (fenced, or being rebuilt): nothing credited,
--                try again later
local epoch = redis.call('HGET', KEYS[3], 'epoch')
if not epoch then return -2 end
if tonumber(epoch) ~= tonumber(ARGV[4]) then return -1 end
if redis.call('SADD', KEYS[2], ARGV[3]) == 0 then return 0 end
redis.call('HINCRBY', KEYS[1], ARGV[1], tonumber(ARGV[2]))
return 1
