-- park_budget_lead.lua: park a running run whose budget is reached, from its
-- lead segment, under the segment's lead lease (before the lead's next model call).
--
-- KEYS[1]  run record hash          <prefix>:run:{run:<id>}
-- ARGV[1]  lease token of the segment
-- ARGV[2]  now, milliseconds since the epoch
--
-- The spend is compared with the budget here again: a budget raised since the
-- caller looked leaves the run running (returns 0, the caller goes on). Parking
-- makes the run "budget_reached" with field "budget_parked" = "lead"; the lead
-- lease is removed and lead_attempts reset (the segment ends, no worker waits).
-- raise_budget.lua moves it on.
--
-- returns  {1, spent, budget} = parked; {0, spent, budget} = not reached, nothing changed
-- errors   "FENCED lead lease lost" when the run is not running under this token
if redis.call('HGET', KEYS[1], 'status') ~= 'running' or redis.call('HGET', KEYS[1], 'lease_token') ~= ARGV[1] then
  return redis.error_reply('FENCED lead lease lost')
end
local spent = tonumber(redis.call('HGET', KEYS[1], 'spent_tokens') or '0')
local budget = tonumber(redis.call('HGET', KEYS[1], 'budget_tokens') or '-1')
if budget < 0 or spent < budget then
  return {0, spent, budget}
end
redis.call('HSET', KEYS[1], 'status', 'budget_reached', 'budget_parked', 'lead', 'updated_at', ARGV[2], 'lead_attempts', 0)
redis.call('HDEL', KEYS[1], 'lease_token', 'lease_until')
return {1, spent, budget}
