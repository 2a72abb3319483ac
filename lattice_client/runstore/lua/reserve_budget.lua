-- reserve_budget.lua: before a model call of a run with a budget, check the
-- spend and reserve the call's estimated tokens, so that calls in flight at
-- once (parallel members) cannot together overshoot the budget.
--
-- KEYS[1]  run record hash          <prefix>:run:{run:<id>}
-- KEYS[2]  the run's reserved calls ...:budget_calls   zset: "<call id>|<tokens>" -> expiry ms
-- ARGV[1]  the call's id (unique per call)
-- ARGV[2]  the call's own estimate, tokens (an integer >= 0: its request's
--          estimated input tokens); the estimate used is the larger of it and
--          the run's largest call so far (record field "budget_call_max")
-- ARGV[3]  how long the reservation holds, milliseconds (a crashed worker's
--          reservation lapses then)
--
-- Reservations past their expiry (the Redis server's clock) are dropped first.
-- Then, with spent = "spent_tokens", reserved = the sum of the reservations
-- left and estimate as above:
--   spent >= budget                         -> "reached" (the caller parks)
--   spent + reserved + estimate <= budget,
--   or no other call in flight              -> "go": the reservation is added
--                                              (the call past the budget goes
--                                              only alone: at most one)
--   otherwise                               -> "wait": nothing changed; the
--                                              caller waits for the calls in
--                                              flight to land, then asks again
-- The zset expires with its last reservation.
--
-- returns  {"go", spent, budget, reserved member}       (budget -1: the run has no budget; member "")
--          {"reached", spent, budget, ""}
--          {"wait", spent, budget, ms until the earliest reservation lapses}
-- errors   "NORUN run not found"
local raw = redis.call('HMGET', KEYS[1], 'status', 'budget_tokens', 'spent_tokens', 'budget_call_max')
if not raw[1] then
  return redis.error_reply('NORUN run not found')
end
local spent = tonumber(raw[3] or '0')
if not raw[2] then
  return {'go', spent, -1, ''}
end
local budget = tonumber(raw[2])
if spent >= budget then
  return {'reached', spent, budget, ''}
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
local estimate = math.max(tonumber(ARGV[2]), tonumber(raw[4] or '0'))
local held = redis.call('ZRANGE', KEYS[2], 0, -1, 'WITHSCORES')
local reserved = 0
local earliest = nil
for i = 1, #held, 2 do
  local tokens = tonumber(string.match(held[i], '|(%d+)$') or '0')
  reserved = reserved + tokens
  local expiry = tonumber(held[i + 1])
  if earliest == nil or expiry < earliest then
    earliest = expiry
  end
end
if #held > 0 and spent + reserved + estimate > budget then
  return {'wait', spent, budget, math.max(earliest - now, 1)}
end
local member = ARGV[1] .. '|' .. estimate
local ttl = tonumber(ARGV[3])
redis.call('ZADD', KEYS[2], now + ttl, member)
if redis.call('PTTL', KEYS[2]) < ttl then
  redis.call('PEXPIRE', KEYS[2], ttl)
end
return {'go', spent, budget, member}
