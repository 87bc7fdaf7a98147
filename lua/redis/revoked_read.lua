-- revoked_read.lua: every revoked-token entry (a reader's whole read; its change reads
-- are plain HMGETs of the log); with ARGV[2] = 1 it first drops the entries that
-- void nothing any more (every token they void expired before ARGV[1]). One script, so
-- an entry raised meanwhile (revoke_tokens.lua) is never dropped. Dropping leaves the
-- version as it is: readers keep such an entry until their next whole read or its own
-- end (it voids nothing), and the log of changes (`l:<version>`) stays unbroken.
--
-- KEYS[1] revoked  hash  user id → Unix s (revoke_tokens.lua); `v` → version;
--                        `l:<version>` → the change of that version (not returned)
-- ARGV[1] Unix s: entries below it are dropped   ARGV[2] 1: drop them first
--
-- Returns (mirrored by Revoked in core/src/auth/revoked.rs) a flat list: the version,
-- the change that made it (`l:<version>`, "" if the log has none), then user id, Unix s,
-- user id, Unix s, ... With ARGV[2] = 1 it also drops the log's fields older than its
-- last LOG_KEEP (a version raised by hand leaves them behind).
local LOG_KEEP = 1000 -- revoke_tokens.lua's
local version = redis.call('HGET', KEYS[1], 'v') or '0'
local change = redis.call('HGET', KEYS[1], 'l:' .. version) or ''
local prune = ARGV[2] == '1'
local drop_below = tonumber(ARGV[1])
local oldest_kept = (tonumber(version) or 0) - LOG_KEEP
local all = redis.call('HGETALL', KEYS[1])
local out = { version, change }
for i = 1, #all, 2 do
  local field = all[i]
  -- A user id (digits); not `v`, nor a logged change.
  if string.find(field, '^%d+$') then
    if prune and (tonumber(all[i + 1]) or 0) < drop_below then
      redis.call('HDEL', KEYS[1], field)
    else
      out[#out + 1] = field
      out[#out + 1] = all[i + 1]
    end
  elseif prune and string.sub(field, 1, 2) == 'l:' and (tonumber(string.sub(field, 3)) or 0) <= oldest_kept then
    redis.call('HDEL', KEYS[1], field)
  end
end
return out
