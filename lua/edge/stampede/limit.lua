-- Rate limits over one lua_shared_dict, seed 002's four algorithms. Each check returns
-- nil when the request may pass, or the seconds until it would (for Retry-After).
--
-- fixed_window    limit per window_s, counted from the window's start   (1 atomic incr)
-- sliding_window  limit in any window_s, weighting the previous window  (1 get, 1 incr
--                 or, a window's first, 1 set; both windows' counts in one entry)
-- token_bucket    refills at rate/s up to burst, a request takes one; kept as GCRA's
--                 one number per key (the time the bucket is next full)  (1 get, 1 set)
-- leaky_bucket    drains at rate/s, at most burst waiting in excess, as nginx's limit_req
--                 (the level, with its time in the entry's flags)       (1 get, 1 set)
-- The bucket updates, and a sliding window's first count in a window, are get-then-set
-- without a lock, as lua-resty-limit-req does: under contention between workers a few
-- extra requests may pass; never fewer.
local ngx = ngx
local floor, max = math.floor, math.max
local shared = ngx.shared

local _M = {}

local dict
local specs = {}   -- limit name → {check = fn, ...settings}
local routes = {}  -- route → list of {name, key kind}

local function fixed_window(key, s, now)
  local w = s.window_s
  local win = floor(now / w)
  local n, err = dict:incr(key .. win, 1, 0, w + 1)
  if not n then
    ngx.log(ngx.WARN, "rate limit dict: ", err) -- full dict: let the request pass
    return nil
  end
  if n > s.limit then return (win + 1) * w - now end
end

-- One entry per key, not one per key and window (the purchase path's costliest check was
-- this one: two lookups and a new entry per buyer and window): the value packs the
-- previous window's count and the current one's, previous * SHIFT + current, and the
-- flags hold the current window's number (modulo 2^32).
local WRAP = 4294967296 -- flags are 32 bits
local SHIFT = 67108864  -- 2^26; both counts stay below it (doubles hold 2^52 exactly)
local function sliding_window(key, s, now)
  local w = s.window_s
  local win = floor(now / w)
  local elapsed = now - win * w
  local packed, at = dict:get(key)
  local prev, cur = 0, 0
  if packed then
    local gap = (win - (at or 0)) % WRAP
    if gap == 0 or gap >= WRAP / 2 then
      -- This window's entry, or (gap "negative") one a worker whose clock is a moment
      -- ahead moved on already: counted there, never written over.
      prev, cur = floor(packed / SHIFT), packed % SHIFT
    elseif gap == 1 then
      prev = packed % SHIFT
    end
  end
  if prev * (w - elapsed) / w + cur + 1 > s.limit then return w - elapsed end
  if cur == 0 then
    dict:set(key, prev * SHIFT + 1, 2 * w + 1, win % WRAP)
  elseif cur < SHIFT - 1 then
    -- Counted atomically within a window, as other workers may be counting too. (A
    -- limit above 2^26 per window stops counting there: more may pass, never fewer.)
    local n, err = dict:incr(key, 1)
    if not n then ngx.log(ngx.WARN, "rate limit dict: ", err) end -- evicted: one uncounted
  end
end

local function token_bucket(key, s, now)
  local interval = 1 / s.rate
  local tolerance = (s.burst - 1) * interval
  local tat = max(dict:get(key) or now, now)
  if tat - now > tolerance then return tat - now - tolerance end
  dict:set(key, tat + interval, s.burst * interval + 1)
end

local function leaky_bucket(key, s, now)
  local now_ms = floor(now * 1000)
  local level, last = dict:get(key)
  if level then
    level = max(level - s.rate * ((now_ms - last) % WRAP) / 1000, 0)
  else
    level = 0
  end
  level = level + 1
  if level > s.burst then return (level - s.burst) / s.rate end
  dict:set(key, level, s.burst / s.rate + 1, now_ms % WRAP)
end

local ALGORITHMS = {
  fixed_window = fixed_window, sliding_window = sliding_window,
  token_bucket = token_bucket, leaky_bucket = leaky_bucket,
}

-- A settings table is usable when its algorithm is known and its numbers positive.
local function usable(s)
  local check = type(s) == "table" and ALGORITHMS[s.algo]
  if not check then return nil end
  local a, b = "limit", "window_s"
  if s.algo == "token_bucket" or s.algo == "leaky_bucket" then a, b = "rate", "burst" end
  if type(s[a]) ~= "number" or s[a] <= 0 or type(s[b]) ~= "number" or s[b] <= 0 then return nil end
  return check
end

-- opts.dict: the shared dict's name; opts.limits: name → settings (nginx.conf's
-- defaults); opts.routes: route → list of {limit name, "ip" | "user" | "event"}.
function _M.init(opts)
  dict = assert(shared[opts.dict], "lua_shared_dict " .. tostring(opts.dict) .. " is not declared")
  for name, s in pairs(opts.limits) do
    s.check = assert(usable(s), "limit " .. name .. ": unknown algo or non-positive numbers")
    s.prefix = name .. ":" .. s.algo .. ":"
    s.default = true
    specs[name] = s
  end
  for route, list in pairs(opts.routes) do
    for _, entry in ipairs(list) do
      assert(specs[entry[1]], "route " .. route .. " names unknown limit " .. tostring(entry[1]))
      assert(entry[2] == "ip" or entry[2] == "user" or entry[2] == "event", "key kind must be ip, user or event")
    end
    routes[route] = list
  end
  _M.defaults = {}
  for name, s in pairs(specs) do _M.defaults[name] = s end
end

-- Applies overrides (name → settings, from the admin API via Redis) over the defaults;
-- a name absent from overrides goes back to its default. Unknown names are ignored.
function _M.apply(overrides)
  for name, default in pairs(_M.defaults) do
    local s = overrides[name]
    local check = usable(s)
    if s and not check then
      ngx.log(ngx.WARN, "ignoring unusable override of limit ", name)
    end
    if check then
      -- Keys of their own per algorithm: a limit switched to another reads no entry the
      -- old one wrote in its own format.
      s.check, s.prefix = check, name .. ":" .. s.algo .. ":"
      specs[name] = s
    else
      specs[name] = default
    end
  end
end

-- Checks every limit of `route`; nil, or the seconds to wait and the limit's name.
function _M.check(route, ip, user, event)
  local now = ngx.now()
  for _, entry in ipairs(routes[route]) do
    local s = specs[entry[1]]
    local kind = entry[2]
    local key = kind == "ip" and ip or (kind == "user" and user or event)
    local wait = s.check(s.prefix .. key, s, now)
    if wait then return wait, entry[1] end
  end
end

return _M
