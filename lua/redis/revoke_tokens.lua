-- revoke_tokens.lua: voids a user's tokens expiring at or before ARGV[2] (Unix s),
-- and every token that user was ever given: an entry already there is raised past
-- itself (a login after a sign-out got a token expiring one second after the entry),
-- never lowered. Bumps the hash's version (field `v`) and logs the change under it
-- (field `l:<version>`), so readers catch up with the changes since their version
-- instead of reading the whole hash; the log keeps the last LOG_KEEP changes.
--
-- KEYS[1] revoked  hash  user id → Unix s: that user's tokens expiring at or before it
--                        are void (core/src/auth/revoked.rs); `v` → version;
--                        `l:<version>` → "<user id>:<Unix s>", the change of that version
-- ARGV[1] user id   ARGV[2] Unix s
--
-- Returns (mirrored by Revoked in core/src/auth/revoked.rs) the user's entry after
-- the call (Unix s).
local LOG_KEEP = 1000 -- core/src/auth/revoked.rs LOG_KEEP, lua/edge/stampede/state.lua
local before = tonumber(redis.call('HGET', KEYS[1], ARGV[1]))
local want = tonumber(ARGV[2])
if before and want <= before then want = before + 1 end
redis.call('HSET', KEYS[1], ARGV[1], want)
local version = redis.call('HINCRBY', KEYS[1], 'v', 1)
redis.call('HSET', KEYS[1], 'l:' .. version, ARGV[1] .. ':' .. want)
redis.call('HDEL', KEYS[1], 'l:' .. (version - LOG_KEEP))
return want
