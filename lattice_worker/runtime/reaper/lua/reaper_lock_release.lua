-- reaper_lock_release.lua: end a sweep's hold of the reaper lock, only for its holder.
--
-- KEYS[1]  <prefix>:reaper:lock   string: the holder's token
-- ARGV[1]  the caller's token (the one its SET NX PX wrote)
-- ARGV[2]  keep in milliseconds: > 0 keeps the lock that much longer (so the
--          deployment sweeps about once per reaper interval), 0 deletes it now
--
-- Returns  1  released (kept for ARGV[2] ms, or deleted)
--          0  nothing done: the lock expired or another holder took it
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
if tonumber(ARGV[2]) > 0 then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
else
  redis.call('DEL', KEYS[1])
end
return 1
