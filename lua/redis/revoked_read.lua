-- revoked_read.lua: the revoked-token entries still in force, dropping those that void
-- nothing any more (every token they void has expired by ARGV[1]). One script, so an
-- entry raised meanwhile (revoke_tokens.lua) is never dropped.
--
-- KEYS[1] revoked  hash  user id → Unix s (revoke_tokens.lua)
-- ARGV[1] now, Unix s
--
-- Returns (mirrored by Revoked in core/src/auth/revoked.rs) the entries kept, flat:
-- user id, Unix s, user id, Unix s, ...
local now = tonumber(ARGV[1])
local all = redis.call('HGETALL', KEYS[1])
local kept = {}
for i = 1, #all, 2 do
  if (tonumber(all[i + 1]) or 0) < now then
    redis.call('HDEL', KEYS[1], all[i])
  else
    kept[#kept + 1] = all[i]
    kept[#kept + 1] = all[i + 1]
  end
end
return kept
