-- The access phase of the public API, called from nginx.conf: one function per kind of
-- route, each location of /api/ naming its own. In this order: one spelling and one
-- method → auth token (for a purchase all but its signature) → (purchases) sale window →
-- sold out → the token's signature → waiting room → rate limits; every other
-- route: token → rate limits. Whatever passes goes to
-- the core, which verifies the token again; $stampede_user keeps the user id for the
-- edge's own use in the content phase (room.lua), $stampede_purchase the key a purchase
-- let through is remembered under.
local ngx = ngx
local auth = require "stampede.auth"
local limit = require "stampede.limit"
local state = require "stampede.state"
local room = require "stampede.room"
local reject = require("stampede.respond").reject
local match, find, sub, gmatch, byte = string.match, string.find, string.sub, string.gmatch, string.byte
local get_method, exec = ngx.req.get_method, ngx.exec
local U64_MAX = "18446744073709551615" -- compared as strings of 20 digits

local _M = {}

local passed       -- shared dict: "<user>:<event>:<Idempotency-Key>" of purchases let through
local passed_ttl_s
-- A key let through waits this long for the core's answer (proxy_read_timeout and some);
-- only an answer that may be a 202 keeps it for passed_ttl_s.
local PENDING_TTL_S = 15
-- A key's state: let through, or answered (maybe) 202 (also a key another edge let
-- through, or one a sale refused whole admitted, copied from Redis: admitted.lua).
local admitted = require "stampede.admitted"
local PENDING, QUEUED = 1, admitted.QUEUED

-- opts: {passed_dict, passed_ttl_s}
function _M.init(opts)
  passed = assert(ngx.shared[opts.passed_dict], "lua_shared_dict " .. tostring(opts.passed_dict) .. " is not declared")
  passed_ttl_s = opts.passed_ttl_s
end

-- The path exactly as the client sent it must be the one nginx matched: no percent
-- escapes, no "." or ".." segments, nothing nginx normalised on the way. The core
-- accepts one spelling only, and so does the edge.
-- 405 with the Allow header: `method` is what the endpoint takes.
local function wrong_method(method)
  ngx.header["Allow"] = method
  return reject(405, "METHOD_NOT_ALLOWED", "this endpoint takes " .. method)
end

local function one_spelling(method)
  local raw = ngx.var.request_uri
  local q = find(raw, "?", 1, true)
  if q then raw = sub(raw, 1, q - 1) end
  if raw ~= ngx.var.uri then return reject(404, "NOT_FOUND", "no such endpoint") end
  -- nginx.conf's patterns take ids of up to 20 digits; past u64 is no id either.
  for long in gmatch(raw, "/(%d%d%d%d%d%d%d%d%d%d%d%d%d%d%d%d%d%d%d%d)") do
    if long > U64_MAX then return reject(404, "NOT_FOUND", "no such endpoint") end
  end
  local m = get_method()
  if m ~= method and not (method == "GET, POST" and (m == "GET" or m == "POST")) then
    return wrong_method(method)
  end
end

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

-- The category of a purchase, and a train ticket's from and to stations, read from its
-- (small, buffered) body; only asked for when some but not all categories of the event
-- (or some train journeys) are sold out.
-- A body with an escape, or a number not written as plain digits ("20e-1", "2.0", which
-- the core reads as 2; "-0", which it reads as 0), is decoded as JSON, so that the edge
-- reads what the core reads: the category, and a journey's stations.
local cjson = require "cjson.safe"
local function whole(v)
  if type(v) == "number" and v >= 0 and v < 2^53 and v == math.floor(v) then
    return string.format("%d", v)
  end
end
local function category_of()
  ngx.req.read_body()
  local body = ngx.req.get_body_data()
  if not body then return nil end
  if not find(body, "\\", 1, true) and not find(body, "%d%s*[%.eE]") and not find(body, ":%s*%-") then
    return match(body, '"category_id"%s*:%s*(%d+)'), match(body, '"from"%s*:%s*(%d+)'),
      match(body, '"to"%s*:%s*(%d+)')
  end
  local doc = cjson.decode(body)
  if type(doc) ~= "table" then return nil end
  return whole(doc.category_id), whole(doc.from), whole(doc.to)
end

-- The event id of a purchase path sent in its one spelling ("/api/events/<id>/orders",
-- a query allowed), or nil. nginx matched the location on the path it normalised; a
-- path it had to normalise cannot match here, so this is one_spelling's check for the
-- purchase, from one variable instead of three. Read byte by byte, which LuaJIT
-- compiles, not with a Lua pattern, which it does not (1.3 k instructions a request).
local PURCHASE_PREFIX, PURCHASE_TAIL = "/api/events/", "/orders"
local ID_AT = #PURCHASE_PREFIX + 1
local function purchase_event(raw)
  if sub(raw, 1, ID_AT - 1) ~= PURCHASE_PREFIX then return nil end
  local first = byte(raw, ID_AT)
  if not first or first < 49 or first > 57 then return nil end -- 1-9
  local i = ID_AT + 1
  while true do
    local b = byte(raw, i)
    if not b or b < 48 or b > 57 then break end
    i = i + 1
  end
  local tail_end = i + #PURCHASE_TAIL - 1
  local after = byte(raw, tail_end + 1)
  if sub(raw, i, tail_end) ~= PURCHASE_TAIL or (after and after ~= 63) then return nil end -- "?"
  local id = sub(raw, ID_AT, i - 1)
  if #id < 20 or (#id == 20 and id <= U64_MAX) then return id end
end

-- An Idempotency-Key as the core takes it: 1..=64 visible ASCII characters ("!" to "~").
local function good_key(k)
  local n = #k
  if n == 0 or n > 64 then return false end
  for i = 1, n do
    local b = byte(k, i)
    if b < 33 or b > 126 then return false end
  end
  return true
end

-- POST /api/events/{id}/orders. What the edge refuses is answered here; what it lets
-- through goes on to @purchase (nginx.conf), which proxies it to the core and, in its
-- header filter (purchase_answered), learns the core's answer — a filter the refusals,
-- most of a sale's requests, never run.
--
-- A purchase whose Idempotency-Key this edge let through before skips the sale window
-- and the sold-out flags: its first answer may have been 202 (the buyer's connection
-- dropped before it arrived), and only the core knows. The core answers a repeated key
-- with its first answer, whatever the flags; any other purchase still meets them there.
-- Keys let through by other edges are known here too, a refresh or two after their
-- answer, in a sale with a category sold out; and once a sale is refused whole
-- (closed, ended, all sold out), every key it admitted (admitted.lua).
function _M.purchase()
  local event_id = purchase_event(ngx.var.request_uri)
  if not event_id then return reject(404, "NOT_FOUND", "no such endpoint") end
  if get_method() ~= "POST" then return wrong_method("POST") end
  -- Everything of the token but its signature, unless this worker verified it before:
  -- a refusal from memory (sold out, not open) does not need it, and a stampede's
  -- buyers each bring a token the edge has not seen.
  local uid, why, verified = auth.claimed_user()
  if not uid then return reject(401, "UNAUTHORIZED", why) end
  -- As the core asks (public/orders.rs): a purchase without its key is no purchase,
  -- whatever the flags say.
  local k = ngx.var.http_idempotency_key
  if not k or not good_key(k) then
    return reject(400, "INVALID", "header Idempotency-Key is required: 1..=64 visible ASCII characters")
  end
  local status, code, message = state.gate(event_id, category_of)
  -- The remembered key: the buyer, the event and the Idempotency-Key.
  local key = uid .. ":" .. event_id .. ":" .. k
  -- The remembered keys are read only for a purchase the flags refuse. A refusal from
  -- memory says what the sale's listing says (open or not, sold out), to any
  -- well-formed token of a known key whatever its signature.
  if status and not passed:get(key) then return reject(status, code, message) end
  -- What goes on past here is a verified buyer's. A bad signature on a remembered key
  -- hears the flags' refusal too: 401 there would tell a forger that the buyer it claims
  -- had that key let through.
  if not verified then
    uid, why = auth.user()
    if not uid then
      if status then return reject(status, code, message) end
      return reject(401, "UNAUTHORIZED", why)
    end
  end
  if not status then
    -- A sale behind a waiting room (or the hidden path) admits purchases with a pass.
    local code, refusal = room.pass_refusal(state, event_id, uid)
    if code and not passed:get(key) then return reject(403, code, refusal) end
  end
  -- The limits only for what goes on to the core: they protect it, and a refusal from
  -- memory costs it nothing (and the limits' shared-dict writes were most of the cost
  -- of a sold-out answer). A buyer pressing "buy" on a sold-out sale hears so, not 429.
  limited("orders", uid, event_id)
  ngx.var.stampede_purchase = key
  -- Pending until the core answers; a key remembered already keeps its lifetime. Never
  -- evicting (safe_add): a full dict costs a new key its shortcut, not someone else's.
  passed:safe_add(key, PENDING, PENDING_TTL_S)
  return exec("@purchase")
end

-- The header filter of @purchase, and of @core_unavailable (nginx.conf): an answer
-- that is, or may be, a 202 — a 202, a 5xx of the core's, nginx's 503 when the core had
-- the request and did not answer in time — keeps the key let through
-- ($stampede_purchase) for passed_ttl_s; any other answer forgets a pending key (its
-- repeat meets the flags again) and leaves a key that had a 202 before as it is: also
-- nginx's 503 when not a byte reached a core (refused connections), so an outage
-- does not fill the dict for passed_ttl_s with keys no core ever saw. Keys of nginx's
-- own 4xx on the way lapse within PENDING_TTL_S.
function _M.purchase_answered(from_core)
  local key = ngx.var.stampede_purchase
  if not key or key == "" then return end
  local status = ngx.status
  -- The core's own SALE_BUSY that admitted nothing says so in a header for this filter
  -- alone (proxy_core.conf hides it from clients; the upstream's variable still has
  -- it): such a key is a refused one, not one a core may have taken, and is not let
  -- past the flags for an hour (review).
  local nothing = ngx.var.upstream_http_x_stampede_admitted == "none"
  -- A core that answered had the request (from_core: @purchase, where the answer is the
  -- core's own); for nginx's own 503 (@core_unavailable), $upstream_bytes_sent says
  -- whether a core had some of it, per core tried ("0", "0, 517", ...). That variable
  -- is written when the upstream request ends: while the core's own answer's header
  -- passes here it is still empty, so a core's OUTCOME_UNKNOWN forgot the key before.
  local may_be_queued = status == 202
    or (status >= 500 and not nothing
      and (from_core or find(ngx.var.upstream_bytes_sent or "", "[1-9]") ~= nil))
  if may_be_queued then
    -- Shared with the other edges at the next refresh (admitted.lua), once per key.
    if passed:get(key) ~= QUEUED then admitted.queued(key) end
    local ok, err = passed:safe_set(key, QUEUED, passed_ttl_s)
    if not ok then ngx.log(ngx.WARN, "idempotency-key dict: ", err) end
  elseif passed:get(key) == PENDING then
    passed:delete(key)
  end
end

-- /api/events/{id}/queue: GET (your place, answered by room.lua) and POST (join, the
-- core's); a valid token and the API's limits.
function _M.queue()
  one_spelling("GET, POST")
  local uid = authenticate()
  limited("api", uid, "")
end

-- Every other call of the public API but login: a valid token, and the API's limits.
function _M.api(method)
  one_spelling(method)
  local uid = authenticate()
  limited("api", uid, "")
end

-- GET /api/events/{id}/orders/status: as api("GET"), and an Idempotency-Key, if sent,
-- as the core takes it: nginx passes no empty header on, and the core would answer the
-- buyer's latest purchase where it refuses the empty key asked of it directly.
function _M.purchase_status()
  one_spelling("GET")
  local uid = authenticate()
  limited("api", uid, "")
  local k = ngx.var.http_idempotency_key
  if k and not good_key(k) then
    return reject(400, "INVALID", "header Idempotency-Key must be 1..=64 visible ASCII characters")
  end
end

-- POST /api/login: no token yet; its own limits (per client address). The core limits
-- failed attempts per account.
function _M.login()
  one_spelling("POST")
  limited("login", "", "")
end

-- POST /api/payments/callback: the provider's, signed (checked by the core), no token.
function _M.callback()
  one_spelling("POST")
  limited("callback", "", "")
end

return _M
