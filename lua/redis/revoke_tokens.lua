-- revoke_tokens.lua: voids a user's tokens expiring at or before ARGV[2] (Unix s),
-- raising the user's entry only: a revocation never shortens another.
--
-- KEYS[1] revoked  hash  user id → Unix s: that user's tokens expiring at or before it
--                        are void (core/src/auth/revoked.rs)
-- ARGV[1] user id   ARGV[2] Unix s
--
-- Returns (mirrored by Revoked in core/src/auth/revoked.rs) the user's entry after
-- the call (Unix s).
local before = tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '0') or 0
local want = tonumber(ARGV[2])
if want > before then
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
  return want
end
return before
