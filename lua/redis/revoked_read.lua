-- revoked_read.lua: the revoked-token entries, unless the hash's version is still the
-- one the caller has (then one HGET); with ARGV[3] = 1 it first drops the entries that
-- void nothing any more (every token they void expired before ARGV[1]). One script, so
-- an entry raised meanwhile (revoke_tokens.lua) is never dropped. Dropping leaves the
-- version as it is: readers keep such an entry until their next whole read or its own
-- end (it voids nothing), and the log of changes (`l:<version>`) stays unbroken.
--
-- KEYS[1] revoked  hash  user id → Unix s (revoke_tokens.lua); `v` → version;
--                        `l:<version>` → the change of that version (not returned)
-- ARGV[1] Unix s: entries below it are dropped   ARGV[2] the version the caller has
-- ARGV[3] 1: drop the entries below ARGV[1] first
--
-- Returns (mirrored by Revoked in core/src/auth/revoked.rs) a flat list: the version,
-- then (unless it is the caller's and nothing was dropped) user id, Unix s, user id,
-- Unix s, ...
local version = redis.call('HGET', KEYS[1], 'v') or '0'
local prune = ARGV[3] == '1'
if not prune and version == ARGV[2] then return { version } end
local drop_below = tonumber(ARGV[1])
local all = redis.call('HGETALL', KEYS[1])
local out = { version }
for i = 1, #all, 2 do
  -- A user id (digits); not `v`, nor a logged change.
  if string.find(all[i], '^%d+$') then
    if prune and (tonumber(all[i + 1]) or 0) < drop_below then
      redis.call('HDEL', KEYS[1], all[i])
    else
      out[#out + 1] = all[i]
      out[#out + 1] = all[i + 1]
    end
  end
end
return out
