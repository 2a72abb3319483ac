-- renew_budget.lua: push out the expiry of a model call's budget reservation
-- while the call is in flight (so a call longer than the reservation's
-- lifetime keeps its place; a crashed worker renews nothing and its
-- reservation lapses).
--
-- KEYS[1]  the run's reserved calls ...:budget_calls   zset (see reserve_budget.lua)
-- ARGV[1]  the reservation (the member reserve_budget.lua returned)
-- ARGV[2]  how long it holds from now, milliseconds (the Redis server's clock)
--
-- A reservation that lapsed meanwhile is added back: the call is still in
-- flight, so it still counts against what is left of the budget. The caller
-- stops renewing before spend_budget.lua releases it.
--
-- returns  1 (renewed) or 0 (added back after it lapsed)
-- errors   none
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[2])
local renewed = 1
if not redis.call('ZSCORE', KEYS[1], ARGV[1]) then
  renewed = 0
end
redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
if redis.call('PTTL', KEYS[1]) < ttl then
  redis.call('PEXPIRE', KEYS[1], ttl)
end
return renewed
