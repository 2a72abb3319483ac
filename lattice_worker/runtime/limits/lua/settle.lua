-- settle.lua: correct a reservation once the call's usage is known (or give back an unused one).
--
-- KEYS[1]  <prefix>:ratelimit:{<model>|<key id>}:bucket   hash: <dim>:t -> tokens (float), <dim>:ts -> ms
-- KEYS[2]  <prefix>:ratelimit:{<model>|<key id>}:waiting  zset: ticket -> ms its turn comes
-- ARGV[1]  period in ms (> 0)
-- ARGV[2..4]  capacities per period: requests, input tokens, output tokens (0: not limited)
-- ARGV[5..7]  amounts to take more (> 0) or give back (< 0): requests, input tokens, output tokens
-- ARGV[8]  ticket to drop from KEYS[2] ("" none)
--
-- Returns  {requests, input, output}: the buckets' levels after it (strings; "" where not limited)
local period = tonumber(ARGV[1])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local names = {'requests', 'input', 'output'}
local out = {'', '', ''}
for i = 1, 3 do
  local cap = tonumber(ARGV[1 + i])
  if cap > 0 then
    local rate = cap / period
    local state = redis.call('HMGET', KEYS[1], names[i] .. ':t', names[i] .. ':ts')
    local level = cap
    if state[1] then
      level = math.min(cap, tonumber(state[1]) + (now - tonumber(state[2])) * rate)
    end
    level = math.min(cap, level - tonumber(ARGV[4 + i]))
    redis.call('HSET', KEYS[1], names[i] .. ':t', level, names[i] .. ':ts', now)
    out[i] = tostring(level)
  end
end
redis.call('PEXPIRE', KEYS[1], 2 * period)
if ARGV[8] ~= '' then
  redis.call('ZREM', KEYS[2], ARGV[8])
end
return out
