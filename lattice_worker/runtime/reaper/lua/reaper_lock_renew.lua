-- reaper_lock_renew.lua: push the reaper lock's expiry out, only for its holder.
--
-- KEYS[1]  <prefix>:reaper:lock   string: the holder's token
-- ARGV[1]  the caller's token (the one its SET NX PX wrote)
-- ARGV[2]  hold in milliseconds (the lock expires that long after now)
--
-- Returns  1  renewed: the caller still holds the lock
--          0  not renewed: the lock expired or another holder took it
--             (the caller lost it and must stop its sweep's writes)
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
