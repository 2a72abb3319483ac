-- default_budget.lua: give a run its team's default token budget, unless it has one.
--
-- KEYS[1]  run record hash          <prefix>:run:{run:<id>}
-- ARGV[1]  the team's default budget, tokens (a positive integer)
--
-- returns  the run's budget afterwards (its own when it had one), 0 = no such run
-- errors   none
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
local own = redis.call('HGET', KEYS[1], 'budget_tokens')
if own then
  return tonumber(own)
end
redis.call('HSET', KEYS[1], 'budget_tokens', ARGV[1])
redis.call('HSETNX', KEYS[1], 'spent_tokens', 0)
return tonumber(ARGV[1])
