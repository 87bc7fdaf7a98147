-- move_in.lua: the second step of a move (move_out.lua): credits the units where they
-- go, once per move id, whoever calls it (the core that moved them, or the sweeper
-- replaying a move whose record outlived a few seconds).
--
-- KEYS[1] stock     hash  category id → units (the pool's or the bucket's)
-- KEYS[2] credited  set   the move ids this place has been credited with
-- ARGV[1] category id   ARGV[2] units   ARGV[3] move id
--
-- Returns (mirrored by Credited in core/src/buckets.rs):
--    1 NOW     credited now
--    0 BEFORE  credited before: nothing changed
if redis.call('SADD', KEYS[2], ARGV[3]) == 0 then return 0 end
redis.call('HINCRBY', KEYS[1], ARGV[1], tonumber(ARGV[2]))
return 1
