-- renew_lock.lua: extend a lock's time-to-live only if we still own it.
--
-- KEYS[1]  the lock key
-- ARGV[1]  the owner token written when the lock was taken
-- ARGV[2]  the new time-to-live in milliseconds
--
-- Returns (mirrored by Owned in core/src/lock.rs):
--    1 YES  renewed (we own it)
--    0 NO   not renewed: expired, or now held by another owner
local rcall = redis.call
if rcall('GET', KEYS[1]) == ARGV[1] then
  rcall('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
