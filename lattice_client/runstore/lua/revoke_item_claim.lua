-- revoke_item_claim.lua: a member's claim on one work item expired (the reaper
-- requeued or failed its message): its writes to the item stop here, before
-- any later claim begins.
--
-- KEYS[1]  the item's tool journal hash   <prefix>:run:{run:<id>}:item:<work_item_id>:journal
-- ARGV[1]  the attempts of the claim that expired
-- ARGV[2]  expiry of the item's keys in milliseconds
--
-- The item's "~fence" becomes "<attempts> ~revoked": the expired claim (same
-- attempts, another token) is refused by begin_item.lua, write_item.lua,
-- park_item.lua and append_events_fenced.lua; a later claim (more attempts)
-- takes the item over as usual. A fence already naming a later claim stays.
--
-- returns  1 revoked, 0 a later claim holds the item (nothing changed)
-- errors   none
local fence = redis.call('HGET', KEYS[1], '~fence')
if fence then
  local attempts = tonumber(string.match(fence, '^(%d+) '))
  if attempts and attempts > tonumber(ARGV[1]) then
    return 0
  end
end
redis.call('HSET', KEYS[1], '~fence', ARGV[1] .. ' ~revoked')
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
