-- park_budget_item.lua: park a member's work item whose run's budget is reached
-- (before the member's next model call), under the item's claim. The caller
-- then moves the message to "parked" with its claim token.
--
-- KEYS[1]  run record hash          <prefix>:run:{run:<id>}
-- KEYS[2]  the run's budget waits   ...:budget_waits   work_item_id -> JSON
-- ARGV[1]  work_item_id
-- ARGV[2]  the wait JSON (run_id, team, member, message_id, mailbox_id, work_item_id, created_at)
-- ARGV[3]  now, milliseconds since the epoch
--
-- The spend is compared with the budget here again (a budget raised since the
-- caller looked: returns 0, nothing changed, the member goes on). A run
-- "suspended" on its work items becomes "budget_reached" (its lead waits for
-- them; raise_budget.lua moves it back); a run in another status keeps it.
--
-- returns  {1, spent, budget} = parked; {0, spent, budget} = not reached
-- errors   "NORUN run not found"
--          "BADSTATE <status>" when the run is finished
local status = redis.call('HGET', KEYS[1], 'status')
if not status then
  return redis.error_reply('NORUN run not found')
end
if status == 'completed' or status == 'failed' or status == 'cancelled' then
  return redis.error_reply('BADSTATE ' .. status)
end
local spent = tonumber(redis.call('HGET', KEYS[1], 'spent_tokens') or '0')
local budget = tonumber(redis.call('HGET', KEYS[1], 'budget_tokens') or '-1')
if budget < 0 or spent < budget then
  return {0, spent, budget}
end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
if status == 'suspended' then
  redis.call('HSET', KEYS[1], 'status', 'budget_reached', 'updated_at', ARGV[3])
end
return {1, spent, budget}
