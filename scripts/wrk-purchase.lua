-- wrk script for scripts/measure-edge.sh: POST a purchase, rotating through the tokens
-- in $TOKENS (one per line), each request with its own Idempotency-Key.
local tokens = {}
for line in io.lines(os.getenv("TOKENS")) do tokens[#tokens + 1] = line end
local body = os.getenv("BODY")
local n, thread_tag = 0, tostring(math.random(1, 1e9))
request = function()
  n = n + 1
  return wrk.format("POST", nil, {
    ["Authorization"] = "Bearer " .. tokens[n % #tokens + 1],
    ["Idempotency-Key"] = thread_tag .. "-" .. n,
    ["Content-Type"] = "application/json",
  }, body)
end
