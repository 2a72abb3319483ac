-- suspend.lua: suspend a running run until its wait set is empty.
--
-- KEYS[1]  run record hash          <prefix>:run:{run:<id>}
-- KEYS[2]  wait set                 ...:wait
-- ARGV[1]  now, milliseconds since the epoch
-- ARGV[2]  lead lease token of the calling segment ("" or absent = not checked)
--
-- With a token, a run that is not finished must be "running" under that token.
-- Suspending ends the segment: the lead lease is removed and lead_attempts
-- reset to 0.
--
-- returns  1 = the run is now "suspended" (or already was) and waits for items;
--          0 = the wait set is empty: status unchanged, the caller continues
-- errors   "NORUN run not found"
--          "BADSTATE <status>" when the run is neither running nor suspended
--          "FENCED lead lease lost" when the token does not hold the run
local status = redis.call('HGET', KEYS[1], 'status')
if not status then
  return redis.error_reply('NORUN run not found')
end
local token = ARGV[2] or ''
if token ~= '' and status ~= 'completed' and status ~= 'failed' and status ~= 'cancelled' then
  if status ~= 'running' or redis.call('HGET', KEYS[1], 'lease_token') ~= token then
    return redis.error_reply('FENCED lead lease lost')
  end
end
if status == 'suspended' then
  return 1
end
if status ~= 'running' then
  return redis.error_reply('BADSTATE ' .. status)
end
if redis.call('SCARD', KEYS[2]) == 0 then
  return 0
end
redis.call('HSET', KEYS[1], 'status', 'suspended', 'updated_at', ARGV[1], 'lead_attempts', 0)
redis.call('HDEL', KEYS[1], 'lease_token', 'lease_until')
return 1
