-- suspend.lua: suspend a running run until its wait set is empty.
--
-- KEYS[1]  run record hash          <prefix>:run:{run:<id>}
-- KEYS[2]  wait set                 ...:wait
-- ARGV[1]  now, milliseconds since the epoch
--
-- returns  1 = the run is now "suspended" (or already was) and waits for items;
--          0 = the wait set is empty: status unchanged, the caller continues
-- errors   "NORUN run not found"
--          "BADSTATE <status>" when the run is neither running nor suspended
local status = redis.call('HGET', KEYS[1], 'status')
if not status then
  return redis.error_reply('NORUN run not found')
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
redis.call('HSET', KEYS[1], 'status', 'suspended', 'updated_at', ARGV[1])
return 1
