-- The access phase of /api/, called from nginx.conf, one function per kind of route.
-- In this order: auth token → rate limits → sale window → sold out. Whatever passes
-- goes to the core with the user id in $stampede_user (the header the core receives).
local ngx = ngx
local auth = require "stampede.auth"
local limit = require "stampede.limit"
local state = require "stampede.state"
local reject = require("stampede.respond").reject
local match = string.match

local _M = {}

local function authenticate()
  local uid, why = auth.user()
  if not uid then return reject(401, "UNAUTHORIZED", why) end
  ngx.var.stampede_user = uid
  return uid
end

local function limited(route, uid, event_id)
  local wait = limit.check(route, ngx.var.binary_remote_addr, uid, event_id)
  if wait then return reject(429, "RATE_LIMITED", "too many requests", wait) end
end

-- The category of a purchase, read from its (small, buffered) body; only asked for
-- when some but not all categories of the event are sold out.
local function category_of()
  ngx.req.read_body()
  local body = ngx.req.get_body_data()
  return body and match(body, '"category_id"%s*:%s*(%d+)')
end

-- POST /api/events/{id}/orders; the id is in $stampede_event.
function _M.purchase()
  if ngx.req.get_method() ~= "POST" then return end -- the core answers anything else
  local uid = authenticate()
  local event_id = ngx.var.stampede_event
  limited("orders", uid, event_id)
  local status, code, message = state.gate(event_id, category_of)
  if status then return reject(status, code, message) end
end

-- Every other /api/ call but login: a valid token, and the API's limits.
function _M.api()
  local uid = authenticate()
  limited("api", uid, "")
end

-- POST /api/login: no token yet; its own limits (per client address).
function _M.login()
  limited("login", "", "")
end

-- POST /api/payments/callback: the provider's, signed (checked by the core), no token.
function _M.callback()
  limited("callback", "", "")
end

return _M
