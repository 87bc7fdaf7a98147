-- Rejections in DESIGN.md's error shape: {"error":{"code":"...","message":"..."}}.
-- nginx writes every refusal from a named location of refusals.conf, whose `return` sets
-- Content-Type (the server's default_type) and Content-Length and writes the body, in
-- fewer instructions than ngx.print with the headers set from Lua (measured there); the
-- answer is one plain response, not chunked. A refusal whose body never changes (sold
-- out, not open, each 401, ...) has its own location with the body written out there:
-- Lua only jumps to it. Any other puts its body in $stampede_refusal first and jumps to
-- its status's location.
local ngx = ngx
local ngx_exec = ngx.exec
local ceil = math.ceil
local OPEN, MIDDLE, CLOSE = '{"error":{"code":"', '","message":"', '"}}'
local count = require("stampede.stats").reject

-- status → its named location in refusals.conf.
local LOCATION = {}
for _, status in ipairs({ 400, 401, 403, 404, 405, 409, 429 }) do
  LOCATION[status] = "@refuse_" .. status
end

-- code → message → {status, location}: the constant bodies refusals.conf holds, read
-- from it by init(), so a location is used only for the very body it writes.
local constant = {}

local _M = {}

-- The constant refusals of refusals.conf's text: each line
--   location @NAME { return STATUS '{"error":{"code":"CODE","message":"MESSAGE"}}'; }
-- (not @refuse_*, the per-status ones). Returns code → message → {status, location},
-- and the lines of that form whose body is not in the error shape (or holds a "$",
-- which nginx would expand): those are left out, their refusals written from Lua.
function _M.parse_constant(text)
  local found, skipped = {}, {}
  for location, status, body in string.gmatch(text, "\nlocation (@[%w_]+) { return (%d%d%d) '([^']*)'; }") do
    local code, message = string.match(body, '^{"error":{"code":"([A-Z_]+)","message":"([^"\\$]*)"}}$')
    if not code or string.sub(location, 1, 8) == "@refuse_" then
      skipped[#skipped + 1] = location
    else
      found[code] = found[code] or {}
      found[code][message] = { status = tonumber(status), location = location }
    end
  end
  return found, skipped
end

-- From init_by_lua: reads the constant refusals from `path`, the rendered refusals.conf
-- that nginx.conf includes (nginx started with -p <dir>/ -c conf/nginx.conf, as
-- scripts/stack.sh and deploy/edge-entrypoint.sh do). Without it nginx does not start:
-- the Lua would jump to locations it cannot know are there.
function _M.init(path)
  local f = assert(io.open(path, "r"))
  local skipped
  constant, skipped = _M.parse_constant("\n" .. f:read("*a"))
  f:close()
  for _, location in ipairs(skipped) do
    ngx.log(ngx.WARN, path, ": ", location, " is not a constant refusal in the error shape; ",
      "its refusal is written from Lua")
  end
end

-- status: HTTP status (one of refusals.conf's); code, message: constant strings;
-- retry_after: seconds or nil. Headers set before (Allow) go out with the answer.
function _M.reject(status, code, message, retry_after)
  count(status, code)
  if retry_after then
    ngx.header["Retry-After"] = ceil(retry_after)
  end
  local by_message = constant[code]
  local fixed = by_message and by_message[message]
  if fixed and fixed.status == status then return ngx_exec(fixed.location) end
  local location = LOCATION[status]
  if not location then error("no refusals.conf location for status " .. tostring(status)) end
  ngx.var.stampede_refusal = OPEN .. code .. MIDDLE .. message .. CLOSE
  return ngx_exec(location)
end

return _M
