-- The edge's set-up, called from nginx.conf: init() in init_by_lua with the settings
-- written there, start() in init_worker_by_lua. Every shared dict the edge uses is
-- named in nginx.conf and passed in here.
local auth = require "stampede.auth"
local limit = require "stampede.limit"
local state = require "stampede.state"
local stats = require "stampede.stats"

local _M = {}

-- opts: token_secret_file, token_secret_file_env, token_secret_env, state_dict, revoked_dict, limit_dict, stats_dict, passed_dict, passed_ttl_s,
-- outbox_dict,
-- queue_dict, avail_dict, avail_recount_s, avail_recounts_per_s, avail_keep_s, redis = {host, port,
-- cluster_nodes, prefix, timeout_ms}, refresh_interval_s, limits, routes (see nginx.conf).
function _M.init(opts)
  -- The token keyring: a file (read here, by the master, at every start and reload —
  -- `nginx -s reload` after `stampede rotate-token-secret`), else an environment variable.
  local text
  local file = opts.token_secret_file
  if not file or file == "" then file = os.getenv(opts.token_secret_file_env) end
  if file and file ~= "" then
    local f = assert(io.open(file, "r"))
    text = f:read("*a")
    f:close()
  else
    text = os.getenv(opts.token_secret_env)
  end
  assert(text and text ~= "", "set " .. opts.token_secret_file_env .. " or " .. opts.token_secret_env)
  local keyring, current = auth.parse_keyring(text)
  auth.init({ keyring = keyring, current = current, cache_size = opts.token_cache_size })
  limit.init({ dict = opts.limit_dict, limits = opts.limits, routes = opts.routes })
  -- One Redis (`host`, `port`), or a Redis Cluster (`cluster_nodes`: "host:port,…",
  -- a few of its nodes; the rest are found through them).
  local r, nodes = opts.redis, {}
  for n in string.gmatch(r.cluster_nodes or "", "[^,%s]+") do nodes[#nodes + 1] = n end
  local cluster = #nodes > 0
  if not cluster then nodes = { r.host .. ":" .. r.port } end
  state.init({
    dict = opts.state_dict, revoked_dict = opts.revoked_dict, nodes = nodes, cluster = cluster, prefix = r.prefix,
    timeout_ms = r.timeout_ms, interval_s = opts.refresh_interval_s,
  })
  stats.init({ dict = opts.stats_dict, revoked_dict = opts.revoked_dict, state_dict = opts.state_dict })
  -- The constant refusals, from refusals.conf as rendered next to nginx.conf.
  require("stampede.respond").init(ngx.config.prefix() .. "conf/refusals.conf")
  require("stampede.room").init({ dict = opts.queue_dict })
  require("stampede.access").init({ passed_dict = opts.passed_dict, passed_ttl_s = opts.passed_ttl_s })
  require("stampede.admitted").init({
    passed_dict = opts.passed_dict, passed_ttl_s = opts.passed_ttl_s, state_dict = opts.state_dict,
    outbox_dict = opts.outbox_dict, prefix = r.prefix, budget_s = opts.refresh_interval_s / 4,
  })
  require("stampede.availability").init({
    dict = opts.avail_dict, recount_s = opts.avail_recount_s,
    recounts_per_s = opts.avail_recounts_per_s, keep_s = opts.avail_keep_s,
  })
end

function _M.start()
  state.start()
  stats.start()
end

return _M
