-- spend_budget.lua: after a model call of a run with a budget (it succeeded
-- or failed), add its tokens to the run's spend and release its reservation.
--
-- KEYS[1]  run record hash          <prefix>:run:{run:<id>}
-- KEYS[2]  the run's reserved calls ...:budget_calls   zset (see reserve_budget.lua)
-- ARGV[1]  tokens the call spent (input, cache writes and reads, output), an integer >= 0 (0: a failed call)
-- ARGV[2]  the call's reservation (the member reserve_budget.lua returned; "": none)
--
-- Every worker's calls for the run add here (HINCRBY on the record's
-- "spent_tokens"), so the spend is the run's across workers. The record's
-- "budget_call_max" keeps the largest call's tokens (the estimate of the next
-- calls' reservations). The reservation is removed in the same step, so no
-- other call sees the call both reserved and spent.
--
-- returns  {spent tokens after the call, budget tokens (-1 = the run has no budget)}
-- errors   "NORUN run not found" (the reservation is released all the same)
if ARGV[2] ~= '' then
  redis.call('ZREM', KEYS[2], ARGV[2])
end
if redis.call('EXISTS', KEYS[1]) == 0 then
  return redis.error_reply('NORUN run not found')
end
local tokens = tonumber(ARGV[1])
local spent = redis.call('HINCRBY', KEYS[1], 'spent_tokens', tokens)
if tokens > tonumber(redis.call('HGET', KEYS[1], 'budget_call_max') or '0') then
  redis.call('HSET', KEYS[1], 'budget_call_max', tokens)
end
local budget = tonumber(redis.call('HGET', KEYS[1], 'budget_tokens') or '-1')
return {spent, budget}
