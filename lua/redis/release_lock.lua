-- release_lock.lua: delete a lock only if we still own it (seed 004's owner-token unlock).
--
-- KEYS[1]  the lock key
-- ARGV[1]  the owner token written when the lock was taken
--
-- Returns (mirrored by Owned in core/src/lock.rs):
--    1 YES  released (we owned it)
--    0 NO   not released: expired, or now held by another owner
local rcall = redis.call
if rcall('GET', KEYS[1]) == ARGV[1] then
  rcall('DEL', KEYS[1])
  return 1
end
return 0
