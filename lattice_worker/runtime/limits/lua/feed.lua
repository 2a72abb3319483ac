-- feed.lua: what the provider said about a key's limits lowers the shared buckets.
--
-- The provider's count wins when it is lower (another client of the key, a limit lower than
-- configured); a 429's retry-after holds every call of the key until it has passed.
--
-- KEYS[1]  <prefix>:ratelimit:{<model>|<key id>}:bucket   hash: <dim>:t -> tokens (float), <dim>:ts -> ms
-- ARGV[1]  period in ms (> 0)
-- ARGV[2..4]  capacities per period: requests, input tokens, output tokens (0: not limited)
-- ARGV[5..7]  remaining per the provider (anthropic-ratelimit-*-remaining), "" where not told
-- ARGV[8]  ms no call may start (retry-after of a 429; 0 none). The provider is behind the
--          buckets by that much: every limited bucket goes down by that many ms of refill (from
--          at most 0), so new turns come that much later; field "shift_ms" grows by it, so the
--          turns already handed out move as much (a turn is its time + the shift since it was
--          taken: lattice_worker.runtime.limits.gate); field "blocked_until" (ms, server clock)
--          is the earliest any call may start. Only what a block adds past the current
--          blocked_until counts (the 429s of calls sent together hold the key once)
--
-- Returns  {requests, input, output}: the buckets' levels after it (strings; "" where not limited)
local period = tonumber(ARGV[1])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local names = {'requests', 'input', 'output'}
local out = {'', '', ''}
-- a block only counts for what it adds past the key's current one (429s of calls sent together)
local block = tonumber(ARGV[8])
local blocked_until = tonumber(redis.call('HGET', KEYS[1], 'blocked_until') or '0')
if block > 0 then
  block = math.max(0, now + block - math.max(blocked_until, now))
end
for i = 1, 3 do
  local cap = tonumber(ARGV[1 + i])
  if cap > 0 then
    local rate = cap / period
    local state = redis.call('HMGET', KEYS[1], names[i] .. ':t', names[i] .. ':ts')
    local level = cap
    if state[1] then
      level = math.min(cap, tonumber(state[1]) + (now - tonumber(state[2])) * rate)
    end
    if ARGV[4 + i] ~= '' then
      level = math.min(level, tonumber(ARGV[4 + i]))
    end
    if block > 0 then
      level = math.min(level, 0) - block * rate
    end
    redis.call('HSET', KEYS[1], names[i] .. ':t', level, names[i] .. ':ts', now)
    out[i] = tostring(level)
  end
end
if block > 0 then
  redis.call('HINCRBY', KEYS[1], 'shift_ms', block)
  redis.call('HSET', KEYS[1], 'blocked_until', math.max(blocked_until, now) + block)
end
redis.call('PEXPIRE', KEYS[1], 2 * period + tonumber(ARGV[8]))
return out
