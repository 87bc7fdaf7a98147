-- Bearer tokens issued by the core: "<user_id>.<expires_unix_s>.<signature>", the
-- signature being HMAC-SHA1 over "<user_id>.<expires_unix_s>" in standard base64
-- without padding (core/src/auth/token.rs). Verified tokens are remembered per worker,
-- so a buyer's repeated requests cost one table lookup, not an HMAC.
local ngx = ngx
local hmac_sha1, encode_base64, ngx_time = ngx.hmac_sha1, ngx.encode_base64, ngx.time
local find, sub, byte, tonumber = string.find, string.sub, string.byte, tonumber
local lrucache = require "resty.lrucache"

local _M = {}

local secret
local verified -- token → {uid, exp}

-- opts.secret: the shared signing secret; opts.cache_size: tokens remembered per worker.
function _M.init(opts)
  assert(type(opts.secret) == "string" and #opts.secret >= 16, "token secret missing or shorter than 16")
  secret = opts.secret
  verified = assert(lrucache.new(opts.cache_size or 200000))
end

local BEARER = "Bearer "

-- The user id of the request's valid token, or nil and why.
function _M.user()
  local header = ngx.var.http_authorization
  if not header or sub(header, 1, 7) ~= BEARER then
    return nil, "missing bearer token"
  end
  local token = sub(header, 8)
  local now = ngx_time()
  local hit = verified:get(token)
  if hit then
    if hit[2] <= now then return nil, "token expired" end
    return hit[1]
  end
  local d1 = find(token, ".", 1, true)
  local d2 = d1 and find(token, ".", d1 + 1, true)
  if not d2 or byte(token, 1) == 48 then -- no leading zero: ids are printed plainly
    return nil, "malformed token"
  end
  local uid, exp = tonumber(sub(token, 1, d1 - 1)), tonumber(sub(token, d1 + 1, d2 - 1))
  if not uid or not exp then
    return nil, "malformed token"
  end
  if encode_base64(hmac_sha1(secret, sub(token, 1, d2 - 1)), true) ~= sub(token, d2 + 1) then
    return nil, "bad token signature"
  end
  if exp <= now then
    return nil, "token expired"
  end
  verified:set(token, { uid, exp })
  return uid
end

return _M
