-- extend_lead_lease.lua: renew the lead lease of a running segment.
--
-- KEYS[1]  run record hash          <prefix>:run:{run:<id>}
-- ARGV[1]  lease token of the segment
-- ARGV[2]  new lease_until, milliseconds since the epoch
--
-- returns  1 = renewed; 0 = refused: the run is not "running" under this token
--          any more (its lease expired and the reaper took it over, it was
--          cancelled, or it finished)
-- errors   none
if redis.call('HGET', KEYS[1], 'status') ~= 'running' then
  return 0
end
if redis.call('HGET', KEYS[1], 'lease_token') ~= ARGV[1] then
  return 0
end
redis.call('HSET', KEYS[1], 'lease_until', ARGV[2])
return 1
