-- The edge's set-up, called from nginx.conf: init() in init_by_lua with the settings
-- written there, start() in init_worker_by_lua. Every shared dict the edge uses is
-- named in nginx.conf and passed in here.
local auth = require "stampede.auth"
local limit = require "stampede.limit"
local state = require "stampede.state"
local stats = require "stampede.stats"

local _M = {}

-- opts: token_secret_env, state_dict, limit_dict, stats_dict, redis = {host, port, prefix,
-- timeout_ms}, refresh_interval_s, limits, routes (see nginx.conf).
function _M.init(opts)
  local secret = os.getenv(opts.token_secret_env)
  assert(secret and secret ~= "", "environment variable " .. opts.token_secret_env .. " is not set")
  auth.init({ secret = secret, cache_size = opts.token_cache_size })
  limit.init({ dict = opts.limit_dict, limits = opts.limits, routes = opts.routes })
  state.init({
    dict = opts.state_dict, host = opts.redis.host, port = opts.redis.port, prefix = opts.redis.prefix,
    timeout_ms = opts.redis.timeout_ms, interval_s = opts.refresh_interval_s,
  })
  stats.init({ dict = opts.stats_dict })
end

function _M.start()
  state.start()
  stats.start()
end

return _M
