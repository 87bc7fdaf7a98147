-- The edge's own answers to purchases and API calls (401, 403, 409, 429, ...) counted by
-- status and code for the ops dashboard. Counting costs a Lua table increment per
-- rejection, in this worker only; a timer adds the counts to a shared dict once a
-- second, which GET /edge/stats (the ops server) reads. Answers the core gave are the
-- core's metric (stampede_purchase_answers_total), not counted here.
local ngx = ngx
local concat, format, pairs = table.concat, string.format, pairs

local _M = {}

local counts = {} -- status → code → rejections since the last flush
local dict_name, revoked_dict, state_dict

function _M.init(opts)
  dict_name, revoked_dict, state_dict = opts.dict, opts.revoked_dict, opts.state_dict
end

function _M.reject(status, code)
  local by = counts[status]
  if not by then
    by = {}
    counts[status] = by
  end
  by[code] = (by[code] or 0) + 1
end

local function flush(premature)
  if premature then return end
  local dict = ngx.shared[dict_name]
  for status, by in pairs(counts) do
    for code, n in pairs(by) do
      if n > 0 then
        dict:incr(status .. " " .. code, n, 0)
        by[code] = 0
      end
    end
  end
end

-- From init_worker.
function _M.start()
  assert(ngx.timer.every(1, flush))
end

-- GET /edge/stats: every worker's counts as JSON, with the edge's clock, and how the
-- edge read the signed-out users.
function _M.render()
  local dict = ngx.shared[dict_name]
  local parts = {}
  for _, key in ipairs(dict:get_keys(0)) do
    parts[#parts + 1] = format('"%s":%d', key, dict:get(key) or 0)
  end
  ngx.header["Content-Type"] = "application/json"
  ngx.header["Cache-Control"] = "no-store"
  -- The signed-out users' reads (state.lua): the hash's version the edge has, its reads
  -- that found a change by what they read, and its whole reads every five minutes.
  local r = ngx.shared[revoked_dict]
  ngx.print('{"now_ms":', format("%d", ngx.now() * 1000), ',"rejected":{', concat(parts, ","), '}',
    ',"revoked":{"version":"', (r:get("#v") or ""):gsub("[^%d]", ""), '","whole_reads":', format("%d", r:get("#whole") or 0),
    ',"change_reads":', format("%d", r:get("#changes") or 0),
    ',"again_reads":', format("%d", r:get("#again") or 0), '}')
  -- The sales snapshot (state.lua): the version published, and the one each worker
  -- answers from.
  local st = ngx.shared[state_dict]
  local workers = {}
  for id = 0, ngx.worker.count() - 1 do
    workers[#workers + 1] = format('"%d":%d', id, st:get("adopted:" .. id) or -1)
  end
  ngx.print(',"snapshot":{"published":', format("%d", st:get("version") or -1),
    ',"workers":{', concat(workers, ","), '}}}')
end

return _M
