-- park_item.lua: open a wait for a person on a member's tool call (a parked
-- call or an approval), under the item's claim. The caller then moves the
-- message to "parked" with its claim token.
--
-- KEYS[1]  the item's tool journal hash   ...:item:<work_item_id>:journal (see begin_item.lua)
-- KEYS[2]  the run's open waits hash      <prefix>:run:{run:<id>}:waits   (wait id -> JSON)
-- ARGV[1]  the claim's attempts
-- ARGV[2]  the claim token
-- ARGV[3]  the wait id
-- ARGV[4]  the wait JSON (kind, run_id, team, member, message_id, tool_use_id, tool_name, input, effect, reason ...)
--
-- Fence as in write_item.lua. A wait written again under the same id (the work
-- re-parked after a crash) replaces the old one.
--
-- returns  1
-- errors   "FENCED item claimed again" when a later claim holds the item
local fence = redis.call('HGET', KEYS[1], '~fence')
if fence then
  local attempts, token = string.match(fence, '^(%d+) (.*)$')
  attempts = tonumber(attempts)
  if attempts > tonumber(ARGV[1]) or (attempts == tonumber(ARGV[1]) and token ~= ARGV[2]) then
    return redis.error_reply('FENCED item claimed again')
  end
end
redis.call('HSET', KEYS[1], '~fence', ARGV[1] .. ' ' .. ARGV[2])
redis.call('HSET', KEYS[2], ARGV[3], ARGV[4])
redis.call('HSET', KEYS[1], '~waiting', ARGV[3])
return 1
