-- take.lua: reserve one model call's share of the buckets of a (model, API key), in FIFO order.
--
-- Token buckets that refill continuously (capacity per period). A call always takes its
-- amounts, even into debt; the debt is the queue: the call may go once the refill has paid
-- it back, so each call gets the next turn after the calls already reserved (its place),
-- and calls never race for the same tokens.
--
-- KEYS[1]  <prefix>:ratelimit:{<model>|<key id>}:bucket   hash: <dim>:t -> tokens (float), <dim>:ts -> ms
-- KEYS[2]  <prefix>:ratelimit:{<model>|<key id>}:waiting  zset: ticket -> ms (server clock) its turn comes
-- ARGV[1]  period in ms (> 0)
-- ARGV[2]  capacity in requests per period (0: not limited)
-- ARGV[3]  capacity in input tokens per period (0: not limited)
-- ARGV[4]  capacity in output tokens per period (0: not limited)
-- ARGV[5]  requests taken (1)
-- ARGV[6]  input tokens taken (the call's estimate)
-- ARGV[7]  output tokens taken (0: a call only waits while that bucket is in debt)
-- ARGV[8]  ticket (the call's id, listed in KEYS[2] while it waits)
--
-- A call that waits records which limit made it wait in KEYS[1] field "waiting:limit"
-- (requests_per_minute | input_tokens_per_minute | output_tokens_per_minute; lattice status).
--
-- Returns  {wait_ms, dim, now_ms, shift_ms}: how long the call must wait (0: go now), which
--          bucket made it wait longest (1 requests, 2 input tokens, 3 output tokens, 0 none), the
--          server's time, and the key's shift so far (feed.lua: its turn moves by later shifts)
local period = tonumber(ARGV[1])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local names = {'requests', 'input', 'output'}
local wait, dim = 0, 0
for i = 1, 3 do
  local cap = tonumber(ARGV[1 + i])
  if cap > 0 then
    local rate = cap / period
    local state = redis.call('HMGET', KEYS[1], names[i] .. ':t', names[i] .. ':ts')
    local level = cap
    if state[1] then
      level = math.min(cap, tonumber(state[1]) + (now - tonumber(state[2])) * rate)
    end
    level = level - tonumber(ARGV[4 + i])
    redis.call('HSET', KEYS[1], names[i] .. ':t', level, names[i] .. ':ts', now)
    if level < 0 then
      local w = math.ceil(-level / rate)
      if w > wait then
        wait, dim = w, i
      end
    end
  end
end
redis.call('PEXPIRE', KEYS[1], 2 * period + wait)
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
if wait > 0 then
  local limits = {'requests_per_minute', 'input_tokens_per_minute', 'output_tokens_per_minute'}
  redis.call('HSET', KEYS[1], 'waiting:limit', limits[dim])
  redis.call('ZADD', KEYS[2], now + wait, ARGV[8])
  redis.call('PEXPIRE', KEYS[2], period + wait)
end
return {wait, dim, now, tonumber(redis.call('HGET', KEYS[1], 'shift_ms') or '0')}
