-- Bearer tokens issued by the core: "<kid>.<user_id>.<expires_unix_s>.<signature>", the
-- signature being HMAC-SHA1 over "<kid>.<user_id>.<expires_unix_s>" in standard base64
-- without padding, with the secret whose key id is <kid> (core/src/auth/token.rs). The
-- keyring is the current secret and the previous ones, so a rotation logs nobody out;
-- a key id is the first 8 hex digits of its secret's SHA-1. Verified tokens are
-- remembered per worker, by the Authorization header as sent, so a buyer's repeated
-- requests cost a table lookup, not an HMAC; signatures are compared in constant time.
local ngx = ngx
local bit = require "bit"
local hmac_sha1, encode_base64, sha1_bin, ngx_time = ngx.hmac_sha1, ngx.encode_base64, ngx.sha1_bin, ngx.time
local find, sub, byte, char, format, tonumber = string.find, string.sub, string.byte, string.char, string.format, tonumber
local concat = table.concat
local bor, bxor = bit.bor, bit.bxor

local _M = {}

local secrets    -- key id → secret

-- Verified tokens: Authorization header → {uid, exp}, in two plain tables. A header is
-- looked up in `young`, then in `old` (and moved to `young`); when `young` holds
-- `young_max` headers it becomes `old` and the previous `old` is dropped. So the
-- headers used within the last young_max lookups that missed `young` stay, and at most
-- 2 × young_max are kept: an LRU's bound without its bookkeeping on every hit (one
-- table lookup, where resty.lrucache moved a node in its queue each time).
local young, old, young_count, young_max = {}, {}, 0, 100000

local function remember(header, entry)
  if young_count >= young_max then
    old, young, young_count = young, {}, 0
  end
  young[header] = entry
  young_count = young_count + 1
end

-- The key id of a secret: 8 hex digits of its SHA-1, as the core derives it.
local function key_id(secret)
  local d = sha1_bin(secret)
  return format("%02x%02x%02x%02x", byte(d, 1, 4))
end

-- Keyring text → key id → secret, and the current key's id: one secret per line, the
-- current first (the format of the core's auth.token_secret_file); commas separate them
-- in an environment variable.
function _M.parse_keyring(text)
  local ring, n, current = {}, 0, nil
  for line in string.gmatch(text or "", "[^\r\n,]+") do
    local s = string.match(line, "^%s*(.-)%s*$")
    if s ~= "" then
      assert(#s >= 16, "a token secret is shorter than 16 characters")
      ring[key_id(s)] = s
      current = current or key_id(s)
      n = n + 1
    end
  end
  assert(n > 0, "no token secret")
  return ring, current
end

local current_id

-- HMAC-SHA1 (RFC 2104) as two SHA-1s over the secret's padded blocks, computed once per
-- secret. ngx.hmac_sha1 calls OpenSSL 3's HMAC(), which looks the algorithm up and builds
-- and frees its contexts at every call (15.7 k instructions a token): an admitted
-- purchase with a token nginx had not seen took 83 k instructions with it, 75 k with
-- this (callgrind, README "Measured").
local pads = {} -- secret → { inner padded key, outer padded key }

local function padded(secret)
  local key = #secret > 64 and sha1_bin(secret) or secret
  local inner, outer = {}, {}
  for i = 1, 64 do
    local b = byte(key, i) or 0
    inner[i] = char(bxor(b, 0x36))
    outer[i] = char(bxor(b, 0x5c))
  end
  return { concat(inner), concat(outer) }
end

-- The MAC of `text` with the key whose padded blocks are `pad`.
local function hmac(pad, text)
  return sha1_bin(pad[2] .. sha1_bin(pad[1] .. text))
end

-- opts.keyring: key id → secret; opts.current: the id of the key that signs;
-- opts.cache_size: tokens remembered per worker: at least this many of the latest, at
-- most twice as many.
function _M.init(opts)
  secrets = opts.keyring
  current_id = opts.current
  young_max = math.max(1, opts.cache_size or 200000)
  young, old, young_count = {}, {}, 0
  pads = {}
  for _, secret in pairs(secrets) do
    pads[secret] = padded(secret)
    -- The same MAC as OpenSSL's, or nginx does not start.
    local probe = "stampede." .. #secret
    assert(hmac(pads[secret], probe) == hmac_sha1(secret, probe), "HMAC-SHA1 differs from OpenSSL's")
  end
  -- RFC 2202's test case 6: a key longer than a block is hashed first.
  local mac6 = hmac(padded(string.rep("\170", 80)), "Test Using Larger Than Block-Size Key - Hash Key First")
  assert(format(string.rep("%02x", 20), byte(mac6, 1, 20)) == "aa4ae5e15272d00e95705637ce8a3b55ed402112",
    "HMAC-SHA1 fails RFC 2202's test case 6")
end

-- Equal strings, in time that depends on their length only.
local function same(a, b)
  if #a ~= #b then return false end
  local diff = 0
  for i = 1, #a do diff = bor(diff, bxor(byte(a, i), byte(b, i))) end
  return diff == 0
end

local BEARER = "Bearer "

-- An id in canonical decimal: no sign, no leading zero (as the core parses it).
local function canonical_id(s)
  return find(s, "^[1-9]%d*$") ~= nil or s == "0"
end

local function mac(secret, signed)
  return encode_base64(hmac(pads[secret], signed), true)
end

-- "<kid>.<claims>.<signature>" with the current key: what the core's
-- TokenSigner::sign_claims makes (a queue pass, room.lua).
function _M.sign(claims)
  local signed = current_id .. "." .. claims
  return signed .. "." .. mac(secrets[current_id], signed)
end

-- The claims of a string `sign` (or the core) made with a key of the keyring, or nil.
function _M.verify_signed(text)
  local d1 = find(text, ".", 1, true)
  local last
  local i = d1
  while i do
    last = i
    i = find(text, ".", i + 1, true)
  end
  if not d1 or last == d1 then return nil end
  local secret = secrets[sub(text, 1, d1 - 1)]
  if not secret or not same(mac(secret, sub(text, 1, last - 1)), sub(text, last + 1)) then
    return nil
  end
  return sub(text, d1 + 1, last - 1)
end

-- Signed-out users (state.lua's copy in this worker): user id (string) → Unix s at or before which
-- their tokens are void (core/src/auth/revoked.rs).
local revoked = {}
function _M.set_revoked(t)
  revoked = t
end

local function signed_out(user, exp)
  local void_upto = revoked[user]
  return void_upto ~= nil and exp <= void_upto
end

-- The request's token: its user id, or nil and why; and whether its signature was
-- checked (by this call or an earlier one of this worker's). Without `verify` a token
-- not verified before is checked for everything but its signature, and not remembered.
local function token_user(verify)
  local header = ngx.var.http_authorization
  if not header then return nil, "missing bearer token" end
  local now = ngx_time()
  local hit = young[header]
  if not hit then
    hit = old[header]
    if hit then remember(header, hit) end
  end
  if hit then
    if hit[2] <= now then return nil, "token expired" end
    if signed_out(hit[1], hit[2]) then return nil, "token signed out" end
    return hit[1], nil, true
  end
  if sub(header, 1, 7) ~= BEARER then return nil, "missing bearer token" end
  local token = sub(header, 8)
  local d1 = find(token, ".", 1, true)
  local d2 = d1 and find(token, ".", d1 + 1, true)
  local d3 = d2 and find(token, ".", d2 + 1, true)
  if not d3 or find(token, ".", d3 + 1, true) then return nil, "malformed token" end
  local user, exp_s = sub(token, d1 + 1, d2 - 1), sub(token, d2 + 1, d3 - 1)
  local exp = tonumber(exp_s)
  if not canonical_id(user) or #user > 20 or not exp or not find(exp_s, "^%-?%d+$") then
    return nil, "malformed token"
  end
  local secret = secrets[sub(token, 1, d1 - 1)]
  if not secret then return nil, "token signed with a retired or unknown key" end
  if verify and not same(mac(secret, sub(token, 1, d3 - 1)), sub(token, d3 + 1)) then
    return nil, "bad token signature"
  end
  if exp <= now then
    return nil, "token expired"
  end
  -- Only for a verified token: an unverified claim that some user signed out would
  -- tell anyone when they did.
  if not verify then return user, nil, false end
  if signed_out(user, exp) then return nil, "token signed out" end
  remember(header, { user, exp })
  return user, nil, true
end

-- The user id of the request's valid token, or nil and why.
function _M.user()
  return token_user(true)
end

-- The user id the request's token claims, or nil and why; and whether the token is
-- known valid. Everything but the signature of a token this worker has not verified
-- before is checked (its form, key id, expiry): for a purchase the edge refuses from
-- memory (a sold-out sale), answered alike to every well-formed token of a known key,
-- where the HMAC of a token never seen before — a stampede's every buyer — was a third
-- of nginx's CPU per answer (README "Measured"). Whatever lets the request go on must
-- then call user().
function _M.claimed_user()
  return token_user(false)
end

return _M
