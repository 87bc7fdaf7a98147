-- Rejections in DESIGN.md's error shape: {"error":{"code":"...","message":"..."}}.
-- Lua puts the body in $stampede_refusal and nginx answers it from the status's named
-- location (refusals.conf): its `return` sets Content-Type (the server's default_type)
-- and Content-Length and writes the body, in fewer instructions than ngx.print with the
-- headers set from Lua (measured there); the answer is one plain response, not chunked.
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

local _M = {}

-- status: HTTP status (one of refusals.conf's); code, message: constant strings;
-- retry_after: seconds or nil. Headers set before (Allow) go out with the answer.
function _M.reject(status, code, message, retry_after)
  count(status, code)
  if retry_after then
    ngx.header["Retry-After"] = ceil(retry_after)
  end
  local location = LOCATION[status]
  if not location then error("no refusals.conf location for status " .. tostring(status)) end
  ngx.var.stampede_refusal = OPEN .. code .. MIDDLE .. message .. CLOSE
  return ngx_exec(location)
end

return _M
