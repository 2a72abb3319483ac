-- spend_budget.lua: add one model call's tokens to a run's spend (a run with a budget).
--
-- KEYS[1]  run record hash          <prefix>:run:{run:<id>}
-- ARGV[1]  tokens the call spent (input + output), an integer >= 0
--
-- Every worker's calls for the run add here (HINCRBY on the record's
-- "spent_tokens"), so the spend is the run's across workers.
--
-- returns  {spent tokens after the call, budget tokens (-1 = the run has no budget)}
-- errors   "NORUN run not found"
if redis.call('EXISTS', KEYS[1]) == 0 then
  return redis.error_reply('NORUN run not found')
end
local spent = redis.call('HINCRBY', KEYS[1], 'spent_tokens', ARGV[1])
local budget = tonumber(redis.call('HGET', KEYS[1], 'budget_tokens') or '-1')
return {spent, budget}
