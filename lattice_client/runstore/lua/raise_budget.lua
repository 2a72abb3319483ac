-- raise_budget.lua: set a run's token budget to a new total and move on what
-- it parked.
--
-- KEYS[1]  run record hash          <prefix>:run:{run:<id>}
-- KEYS[2]  the run's budget waits   ...:budget_waits   work_item_id -> JSON
-- ARGV[1]  the new budget, tokens (an integer, checked > 0 by the caller; the
--          total already set is accepted again while waits are left: the
--          waits are returned again)
-- ARGV[2]  now, milliseconds since the epoch
--
-- Accepted when the run is "budget_reached", or not finished with its spend at
-- or over its budget (reached, not parked yet), or with members' budget waits
-- left and the same total as the raise that left them (a raise whose caller
-- stopped before moving them on, or one still moving them: a different total
-- then would silently replace the one that raise reported). The new total
-- must be above the spend. A lead parked on the budget ("budget_parked" =
-- "lead") moves to "resuming" (the caller sends lattice.resume_lead); a run
-- whose members parked moves back to "suspended". The members' waits are
-- returned, not removed: the caller moves each message back to "pending",
-- rings its doorbell, then removes its wait (HDEL), so a raise that stopped
-- half-way is finished by the next one.
--
-- returns  {resume lead (1/0), previous budget, spent, member wait JSON...}
-- errors   "NORUN run not found"
--          "BADSTATE <status>"      the run is finished; nothing changed
--          "NOBUDGET"               the run has no budget; nothing changed
--          "NOTREACHED <spent> <budget>"  the budget is not reached; nothing changed
--          "MOVING <budget>"        waits are left from a raise to <budget> and
--                                   ARGV[1] is another total; nothing changed
--          "TOOLOW <spent>"         the new total is not above the spend; nothing changed
local status = redis.call('HGET', KEYS[1], 'status')
if not status then
  return redis.error_reply('NORUN run not found')
end
if status == 'completed' or status == 'failed' or status == 'cancelled' then
  return redis.error_reply('BADSTATE ' .. status)
end
local raw = redis.call('HGET', KEYS[1], 'budget_tokens')
if not raw then
  return redis.error_reply('NOBUDGET')
end
local budget = tonumber(raw)
local spent = tonumber(redis.call('HGET', KEYS[1], 'spent_tokens') or '0')
if status ~= 'budget_reached' and spent < budget then
  if redis.call('HLEN', KEYS[2]) == 0 then
    return redis.error_reply('NOTREACHED ' .. spent .. ' ' .. budget)
  end
  if ARGV[1] ~= raw then
    return redis.error_reply('MOVING ' .. raw)
  end
end
if tonumber(ARGV[1]) <= spent then
  return redis.error_reply('TOOLOW ' .. spent)
end
redis.call('HSET', KEYS[1], 'budget_tokens', ARGV[1], 'updated_at', ARGV[2])
local resume = 0
if status == 'budget_reached' then
  if redis.call('HGET', KEYS[1], 'budget_parked') == 'lead' then
    redis.call('HSET', KEYS[1], 'status', 'resuming')
    resume = 1
  else
    redis.call('HSET', KEYS[1], 'status', 'suspended')
  end
  redis.call('HDEL', KEYS[1], 'budget_parked')
end
local out = {resume, budget, spent}
local waits = redis.call('HVALS', KEYS[2])
for _, w in ipairs(waits) do
  out[#out + 1] = w
end
return out
