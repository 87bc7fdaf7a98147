-- Rejections in DESIGN.md's error shape: {"error":{"code":"...","message":"..."}}.
-- Bodies are written in pieces (ngx.print takes several), never concatenated.
local ngx = ngx
local ngx_print, ngx_exit = ngx.print, ngx.exit
local ceil = math.ceil
local count = require("stampede.stats").reject

local _M = {}

-- status: HTTP status; code, message: constant strings; retry_after: seconds or nil.
function _M.reject(status, code, message, retry_after)
  count(status, code)
  ngx.status = status
  local header = ngx.header
  header["Content-Type"] = "application/json"
  if retry_after then
    header["Retry-After"] = ceil(retry_after)
  end
  ngx_print('{"error":{"code":"', code, '","message":"', message, '"}}')
  return ngx_exit(status)
end

return _M
